"""The closed loop: N workers, each pulling the next ready request as soon as its last ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from benchmarks.replay.workloads import Item

Record = dict[str, Any]
Send = Callable[[Item], Awaitable[Record]]


class OrderError(ValueError):
    """A conversation's turns are not in order in the request list."""


class _Ready:
    """The requests not yet taken, in order; a conversation with one in flight waits."""

    def __init__(self, items: Sequence[Item]) -> None:
        last: dict[str, int] = {}
        for it in items:
            if it.turn <= last.get(it.conv, -1):
                raise OrderError(f"{it.req.rid}: turn {it.turn} of {it.conv} after a later one")
            last[it.conv] = it.turn
        self.pending = list(items)
        self.busy: set[str] = set()

    def take(self) -> Item | None:
        """The first request whose conversation has nothing in flight and no earlier turn left."""
        blocked: set[str] = set()
        for i, it in enumerate(self.pending):
            if it.conv in self.busy or it.conv in blocked:
                blocked.add(it.conv)
                continue
            self.busy.add(it.conv)
            return self.pending.pop(i)
        return None


async def closed_loop(items: Sequence[Item], in_flight: int, send: Send) -> list[Record]:
    """Replay `items` with `in_flight` requests at a time; records in the order they started.

    A conversation's next turn becomes ready only once its previous turn's answer has ended,
    so fewer than `in_flight` run only when nothing else is ready (or at the tail).
    `send` returns a record for failures too; an exception it raises ends the replay.
    """
    if in_flight < 1:
        raise ValueError(f"in_flight must be >= 1, got {in_flight}")
    ready = _Ready(items)
    changed = asyncio.Condition()
    started: list[Record] = []

    async def worker() -> None:
        while True:
            async with changed:
                item = ready.take()
                while item is None and ready.pending:
                    await changed.wait()
                    item = ready.take()
            if item is None:
                return
            slot: Record = {}
            started.append(slot)
            try:
                slot.update(await send(item))
            finally:
                async with changed:
                    ready.busy.discard(item.conv)
                    changed.notify_all()

    async with asyncio.TaskGroup() as tg:
        for _ in range(in_flight):
            tg.create_task(worker())
    return started
