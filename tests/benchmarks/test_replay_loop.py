"""The closed loop: conversation order, exactly N in flight, every request once."""

import asyncio
import random

import pytest

from benchmarks.replay.loop import OrderError, Record, closed_loop
from benchmarks.replay.workloads import ChatSpec, Item, chat_items
from benchmarks.routing_bench.workloads import BenchRequest


def _items(convs: int, turns: int) -> list[Item]:
    """Round by round, like the workloads: every conversation's turn t, then turn t + 1."""
    out = []
    for t in range(turns):
        for c in range(convs):
            out.append(Item(BenchRequest(f"c{c}-t{t}", (), 1, f"c{c}"), f"c{c}", t, c))
    return out


class _Fake:
    """A sender whose requests end in a seeded random order (by yielding, not by sleeping)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.events: list[tuple[str, str]] = []
        self.running = 0
        self.seen_running: list[int] = []  # in flight at each start, this one included

    async def send(self, item: Item) -> Record:
        self.running += 1
        self.seen_running.append(self.running)
        self.events.append(("start", item.req.rid))
        for _ in range(self.rng.randrange(1, 20)):
            await asyncio.sleep(0)  # a yield: lets the other requests progress
        self.running -= 1
        self.events.append(("end", item.req.rid))
        return {"rid": item.req.rid}

    def index(self, kind: str, rid: str) -> int:
        return self.events.index((kind, rid))


@pytest.mark.parametrize("seed", range(5))
async def test_a_turn_never_starts_before_the_previous_turn_ended(seed: int) -> None:
    items = _items(convs=6, turns=5)
    fake = _Fake(seed)
    records = await closed_loop(items, 4, fake.send)
    assert sorted(r["rid"] for r in records) == sorted(i.req.rid for i in items)
    assert [r["rid"] for r in records] == [rid for kind, rid in fake.events if kind == "start"]
    for c in range(6):
        for t in range(1, 5):
            assert fake.index("start", f"c{c}-t{t}") > fake.index("end", f"c{c}-t{t - 1}")


async def test_exactly_n_in_flight_while_enough_requests_are_ready() -> None:
    items = _items(convs=40, turns=1)
    fake = _Fake(7)
    await closed_loop(items, 4, fake.send)
    assert fake.seen_running[:4] == [1, 2, 3, 4]
    # Each end is followed by the next start before anything else runs.
    assert fake.seen_running[4:] == [4] * 36
    assert max(fake.seen_running) == 4


async def test_fewer_in_flight_only_when_conversations_wait_on_their_answers() -> None:
    items = _items(convs=2, turns=6)  # only 2 conversations: at most 2 ready at any time
    fake = _Fake(3)
    await closed_loop(items, 4, fake.send)
    assert max(fake.seen_running) == 2
    assert len(fake.seen_running) == 12


async def test_the_next_ready_request_goes_first_in_list_order() -> None:
    items = _items(convs=3, turns=2)
    fake = _Fake(1)
    records = await closed_loop(items, 1, fake.send)
    # One at a time: always the first ready one, so the list order exactly.
    assert [r["rid"] for r in records] == [i.req.rid for i in items]


async def test_chat_workload_replays_in_user_order() -> None:
    items = chat_items(ChatSpec(users=3, turns=3, system=4, question=2, answer=2), 0, 8)
    assert [(i.conv, i.turn) for i in items[:4]] == [("u0", 0), ("u1", 0), ("u2", 0), ("u0", 1)]
    fake = _Fake(11)
    await closed_loop(items, 2, fake.send)
    for prev, nxt in zip(items, items[3:], strict=False):
        assert prev.conv == nxt.conv
        assert fake.index("start", nxt.req.rid) > fake.index("end", prev.req.rid)


async def test_turns_out_of_order_and_bad_sizes_are_refused() -> None:
    items = _items(convs=1, turns=2)
    with pytest.raises(OrderError):
        await closed_loop(items[::-1], 2, _Fake(0).send)
    with pytest.raises(ValueError):
        await closed_loop(items, 0, _Fake(0).send)


async def test_a_sender_that_raises_ends_the_replay() -> None:
    async def boom(item: Item) -> Record:
        raise RuntimeError(item.req.rid)

    with pytest.raises(ExceptionGroup) as info:
        await closed_loop(_items(convs=3, turns=1), 2, boom)
    assert info.group_contains(RuntimeError)
