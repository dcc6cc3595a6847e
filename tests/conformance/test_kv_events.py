"""KV-cache events on the replica's ZMQ PUB socket, seen from a SUB socket.

Framing per vllm/distributed/kv_events.py (ZmqEventPublisher): ``(topic, seq.to_bytes(8,
"big"), msgpack payload)``, seq counting 0, 1, 2...; replay over ROUTER: send the start seq
after an empty delimiter, get ``(b"", topic, seq, payload)`` per buffered batch, then
``(b"", b"", (-1).to_bytes(8, "big", signed=True), b"")``. Events go out once per engine
step, so a prefix-cache reset's AllBlocksCleared waits for the next step (the next request).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import zmq
import zmq.asyncio

from tests.conformance.helpers import (
    KvSubscriber,
    Prompts,
    Target,
    cached_tokens,
    chain_for,
    complete,
    prompt_of,
    scrape,
)
from vllm_api.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    decode_batch,
    decode_seq,
    encode_seq,
)


@pytest.fixture
async def sub(
    target: Target, client: httpx.AsyncClient, prompts: Prompts
) -> AsyncIterator[KvSubscriber]:
    assert target.zmq_endpoint, "the target must publish KV events"
    subscriber = KvSubscriber(target.zmq_endpoint)
    try:
        await subscriber.make_live(client, target, prompts)
        yield subscriber
    finally:
        subscriber.close()


async def test_framing_and_sequence(
    sub: KvSubscriber, client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    for _ in range(3):
        text, _ = await prompt_of(client, target, prompts, 2 * target.block_size + 1)
        await complete(client, target, text, max_tokens=1)
    while len(sub.messages) < 4:
        assert await sub.recv(10.0) is not None, "KV events stopped arriving"
    topics = {m.frames[0] for m in sub.messages}
    assert len(topics) == 1
    for msg in sub.messages:
        assert len(msg.frames) == 3
        assert len(msg.frames[1]) == 8
        assert msg.seq == int.from_bytes(msg.frames[1], "big")
        assert msg.batch.ts > 1_600_000_000
    seqs = [m.seq for m in sub.messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs


async def test_event_sources_advertise_endpoint_and_topic(
    sub: KvSubscriber, client: httpx.AsyncClient
) -> None:
    resp = await client.get("/kv_event_sources")
    assert resp.status_code == 200
    rank0 = resp.json()["0"]
    assert isinstance(rank0["endpoint"], str) and rank0["endpoint"].startswith("tcp://")
    assert {m.frames[0] for m in sub.messages} == {rank0["topic"].encode()}


async def test_block_stored_for_a_prompt(
    sub: KvSubscriber, client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    text, ids = await prompt_of(client, target, prompts, 3 * target.block_size + 2)
    await complete(client, target, text, max_tokens=1)
    events = await sub.until(
        lambda evs: bool(chain_for(evs, ids, target.block_size)), "BlockStored for the prompt"
    )
    chain = chain_for(events, ids, target.block_size)
    assert chain[0].parent_block_hash is None
    hashes: list[int] = []
    for event in chain:
        assert event.block_hashes and all(isinstance(h, int) for h in event.block_hashes)
        assert all(0 <= h < 1 << 64 for h in event.block_hashes)
        assert len(event.token_ids) == len(event.block_hashes) * target.block_size
        assert event.block_size == target.block_size
        assert event.lora_name is None
        assert event.medium == MEDIUM_GPU
        hashes.extend(event.block_hashes)
    assert len(hashes) == len(ids) // target.block_size == len(set(hashes))


async def test_block_stored_names_the_lora(
    sub: KvSubscriber, client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    assert target.lora is not None
    text, ids = await prompt_of(client, target, prompts, 2 * target.block_size + 2)
    body = {"model": target.lora, "prompt": text, "max_tokens": 1, "ignore_eos": True}
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    events = await sub.until(
        lambda evs: bool(chain_for(evs, ids, target.block_size)), "BlockStored for the LoRA"
    )
    assert all(e.lora_name == target.lora for e in chain_for(events, ids, target.block_size))


async def test_repeated_prompt_stores_nothing_new(
    sub: KvSubscriber, client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    text, ids = await prompt_of(client, target, prompts, 3 * target.block_size + 2)
    await complete(client, target, text, max_tokens=1)
    events = await sub.until(lambda evs: bool(chain_for(evs, ids, target.block_size)), "first")
    stored = {h for e in chain_for(events, ids, target.block_size) for h in e.block_hashes}
    marker_text, marker_ids = await prompt_of(client, target, prompts, 2 * target.block_size + 2)
    await complete(client, target, text, max_tokens=1)
    await complete(client, target, marker_text, max_tokens=1)
    # Events are ordered: once the marker's blocks arrive, the repeat's would have too.
    after = await sub.until(
        lambda evs: bool(chain_for(evs, marker_ids, target.block_size)), "marker prompt"
    )
    new = [e for e in after[len(events) :] if isinstance(e, BlockStored)]
    assert not stored & {h for e in new for h in e.block_hashes}


def _has_chain(ids: list[int], block_size: int) -> Callable[[list[KvEvent]], bool]:
    return lambda events: bool(chain_for(events, ids, block_size))


async def test_filling_the_cache_evicts(
    sub: KvSubscriber, client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    ((labels, _),) = (await scrape(client)).series("vllm:cache_config_info")
    capacity = int(labels["num_gpu_blocks"]) * target.block_size
    size = min(target.max_model_len - 16, capacity // 3)
    stored: set[int] = set()
    gone: set[int] = set()
    for _ in range(capacity // size + 6):
        text, ids = await prompt_of(client, target, prompts, size)
        await complete(client, target, text, max_tokens=1)
        # Events are ordered: evictions this request caused arrive before its own blocks.
        events = await sub.until(_has_chain(ids, target.block_size), "stored")
        stored = {h for e in events if isinstance(e, BlockStored) for h in e.block_hashes}
        gone = {h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes}
        # Blocks stored before the subscription went live are evicted first and unknown here.
        if gone & stored:
            break
    assert gone & stored, "filling the cache never evicted a block announced on this socket"
    for event in sub.events:
        if isinstance(event, BlockRemoved):
            assert event.block_hashes and all(0 <= h < 1 << 64 for h in event.block_hashes)
            assert event.medium == MEDIUM_GPU


async def test_reset_prefix_cache_clears_all(
    sub: KvSubscriber, client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    text, ids = await prompt_of(client, target, prompts, 2 * target.block_size + 2)
    await complete(client, target, text, max_tokens=1)
    await sub.until(lambda evs: bool(chain_for(evs, ids, target.block_size)), "stored")
    seen = len(sub.messages)
    resp = await client.post("/reset_prefix_cache")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"success": True}
    # Nothing is published until the engine steps again: an idle replica stays silent.
    deadline = time.monotonic() + 0.5
    while (left := deadline - time.monotonic()) > 0:
        await sub.recv(left)
    assert len(sub.messages) == seen, [m.batch for m in sub.messages[seen:]]
    again = await complete(client, target, text, max_tokens=1)
    assert cached_tokens(again["usage"]) == 0

    # The queued AllBlocksCleared leads the batch of that next step, before its blocks.
    def since_reset() -> list[KvEvent]:
        return [e for m in sub.messages[seen:] for e in m.batch.events]

    await sub.until(
        lambda _: bool(chain_for(since_reset(), ids, target.block_size)), "the prompt stored again"
    )
    events = since_reset()
    assert isinstance(events[0], AllBlocksCleared), events
    assert not any(isinstance(e, AllBlocksCleared) for e in events[1:]), events


async def test_replay_returns_buffered_batches(
    sub: KvSubscriber, client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    assert target.replay_endpoint, "the target must expose a replay socket"
    text, ids = await prompt_of(client, target, prompts, 2 * target.block_size + 2)
    await complete(client, target, text, max_tokens=1)
    await sub.until(lambda evs: bool(chain_for(evs, ids, target.block_size)), "stored")
    live = {m.seq: m.frames[2] for m in sub.messages}
    (topic,) = {m.frames[0] for m in sub.messages}
    start = min(live)
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(target.replay_endpoint)
        await dealer.send_multipart([b"", encode_seq(start)])
        replayed: dict[int, bytes] = {}
        while True:
            assert await dealer.poll(timeout=10_000), "replay did not answer"
            frames = await dealer.recv_multipart()
            assert len(frames) == 4, frames
            empty, frame_topic, seq_frame, payload = frames
            assert empty == b""
            seq = decode_seq(seq_frame)
            if seq == -1:
                assert (frame_topic, payload) == (b"", b"")
                break
            assert frame_topic == topic
            decode_batch(payload)
            replayed[seq] = payload
    finally:
        dealer.close(linger=0)
        ctx.term()
    assert min(replayed) == start
    assert sorted(replayed) == list(range(start, start + len(replayed)))
    for seq, payload in live.items():
        assert replayed[seq] == payload
