"""Black-box helpers for the conformance suite: HTTP, SSE, Prometheus and ZMQ, nothing else."""

from __future__ import annotations

import asyncio
import json
import math
import random
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from vllm_api.kv_events import (
    BlockStored,
    EventBatch,
    KvEvent,
    decode_batch,
    decode_seq,
)

_WORDS_TEXT = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
    "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu "
    "amber basil cedar dune ember fern grove heath iris jade kelp lotus maple nectar olive"
)
WORDS = tuple(_WORDS_TEXT.split())


@dataclass(frozen=True, slots=True)
class Target:
    """The server under test; ``kind`` is "sim" or "vllm"."""

    base_url: str
    model: str
    lora: str | None
    zmq_endpoint: str | None
    block_size: int
    max_model_len: int
    kind: str
    replay_endpoint: str | None = None


async def wait_for(
    probe: Callable[[], Awaitable[Any]], what: str, within: float = 10.0, interval: float = 0.02
) -> Any:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {within}s waiting for {what} (last: {last!r:.300})")


class Prompts:
    """Deterministic prompt text; a per-run nonce keeps prompts unseen on a long-lived server."""

    def __init__(self, seed: str, nonce: str = "") -> None:
        self._rng = random.Random(seed)
        self._nonce = nonce
        self._count = 0

    def text(self, words: int) -> str:
        self._count += 1
        head = f"{self._nonce} item {self._count}".strip()
        return head + " " + " ".join(self._rng.choice(WORDS) for _ in range(words))


async def tokenize(client: httpx.AsyncClient, target: Target, text: str) -> list[int]:
    resp = await client.post("/tokenize", json={"model": target.model, "prompt": text})
    assert resp.status_code == 200, resp.text
    tokens: list[int] = resp.json()["tokens"]
    return tokens


async def prompt_of(
    client: httpx.AsyncClient, target: Target, prompts: Prompts, min_tokens: int
) -> tuple[str, list[int]]:
    """A fresh prompt of at least ``min_tokens`` tokens that does not end one token short of
    a block boundary (so the first sampled token can never complete a block)."""
    words = max(4, min_tokens // 2)
    for _ in range(200):
        text = prompts.text(words)
        ids = await tokenize(client, target, text)
        if len(ids) < min_tokens:
            words += max(1, (min_tokens - len(ids)) // 2)
            continue
        if len(ids) % target.block_size >= target.block_size - 2:
            words += 1
            continue
        return text, ids
    raise AssertionError(f"could not build a prompt of {min_tokens} tokens")


async def complete(
    client: httpx.AsyncClient, target: Target, prompt: str, max_tokens: int = 4, **extra: Any
) -> dict[str, Any]:
    body = {
        "model": target.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        **extra,
    }
    resp = await client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def cached_tokens(usage: dict[str, Any]) -> int:
    """With --enable-prompt-tokens-details vLLM always reports it, 0 on a cold prompt."""
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def full_blocks(num_tokens: int, block_size: int) -> int:
    """Tokens in the full blocks of a prompt: what prefill leaves in the prefix cache."""
    return num_tokens // block_size * block_size


# --- SSE ---------------------------------------------------------------------------------
@dataclass(slots=True)
class SseStream:
    """A whole SSE body split into frames; ``done`` is whether ``data: [DONE]`` ended it."""

    raw: bytes
    frames: list[bytes]
    done: bool

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(f[len(b"data: ") :]) for f in self.frames if f != b"data: [DONE]"]


def parse_sse(raw: bytes) -> SseStream:
    """Split on the blank line; anything after the last separator is an unterminated frame."""
    parts = raw.split(b"\n\n")
    frames = list(parts[:-1])
    assert parts[-1] == b"", f"unterminated trailing SSE frame: {parts[-1]!r:.200}"
    return SseStream(raw=raw, frames=frames, done=bool(frames) and frames[-1] == b"data: [DONE]")


async def read_stream(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> tuple[httpx.Response, bytes]:
    async with client.stream("POST", path, json=body) as resp:
        raw = b"".join([chunk async for chunk in resp.aiter_raw()])
    return resp, raw


# --- Prometheus ----------------------------------------------------------------------------
@dataclass(slots=True)
class Metrics:
    """One scrape: the raw text and every sample, parsed by prometheus_client."""

    text: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)
    families: dict[str, str] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float:
        """Sum of every sample called ``name`` whose labels include ``labels``."""
        return sum(
            v
            for n, lab, v in self.samples
            if n == name and all(lab.get(k) == want for k, want in labels.items())
        )

    def series(self, name: str) -> Iterator[tuple[dict[str, str], float]]:
        return ((lab, v) for n, lab, v in self.samples if n == name)


async def scrape(client: httpx.AsyncClient) -> Metrics:
    resp = await client.get("/metrics")
    assert resp.status_code == 200, resp.text
    metrics = Metrics(text=resp.text)
    for family in text_string_to_metric_families(resp.text):
        metrics.families[family.name] = family.type
        metrics.samples.extend((s.name, dict(s.labels), float(s.value)) for s in family.samples)
    return metrics


# --- ZMQ KV events -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KvMessage:
    frames: tuple[bytes, ...]
    seq: int
    batch: EventBatch


class KvSubscriber:
    """SUB socket on a replica's KV-event PUB; every message is kept for later assertions."""

    def __init__(self, endpoint: str) -> None:
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self.messages: list[KvMessage] = []

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()

    async def recv(self, within: float) -> KvMessage | None:
        if not await self._sock.poll(timeout=int(within * 1000)):
            return None
        frames = tuple(await self._sock.recv_multipart())
        assert len(frames) == 3, f"a KV-event message has 3 frames, got {len(frames)}"
        msg = KvMessage(frames=frames, seq=decode_seq(frames[1]), batch=decode_batch(frames[2]))
        self.messages.append(msg)
        return msg

    @property
    def events(self) -> list[KvEvent]:
        return [e for m in self.messages for e in m.batch.events]

    async def until(
        self, predicate: Callable[[list[KvEvent]], bool], what: str, within: float = 10.0
    ) -> list[KvEvent]:
        """Receive until ``predicate(all events so far)`` holds."""
        deadline = time.monotonic() + within
        while not predicate(self.events):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for KV events: {what}")
            await self.recv(min(left, 0.5))
        return self.events

    async def make_live(
        self, client: httpx.AsyncClient, target: Target, prompts: Prompts, within: float = 10.0
    ) -> None:
        """Beat the ZMQ slow joiner: send fresh prompts until one of their events arrives."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            text, _ = await prompt_of(client, target, prompts, 2 * target.block_size + 2)
            await complete(client, target, text, max_tokens=1)
            if await self.recv(0.3) is not None:
                return
        raise AssertionError("no KV event arrived: is the subscription live?")


def chain_for(events: list[KvEvent], ids: list[int], block_size: int) -> list[BlockStored]:
    """The BlockStored events (in order) whose tokens are the full blocks of ``ids``."""
    want = ids[: len(ids) // block_size * block_size]
    chain: list[BlockStored] = []
    got: list[int] = []
    for event in events:
        if not isinstance(event, BlockStored) or len(got) >= len(want):
            continue
        n = len(event.token_ids)
        if list(event.token_ids) == want[len(got) : len(got) + n]:
            first = not chain
            if first and event.parent_block_hash is not None:
                continue
            if not first and event.parent_block_hash != chain[-1].block_hashes[-1]:
                continue
            chain.append(event)
            got.extend(event.token_ids)
    return chain if len(got) == len(want) else []


def wav(seconds: float, rate: int = 16000, channels: int = 1, data: bytes | None = None) -> bytes:
    """A 16-bit PCM WAV file: `seconds` of a 440 Hz tone, or `data` as its samples."""
    if data is None:
        tone = (
            round(8000 * math.sin(2 * math.pi * 440 * i / rate))
            for i in range(round(seconds * rate))
        )
        data = b"".join(struct.pack("<h", v) * channels for v in tone)
    fmt = struct.pack("<HHIIHH", 1, channels, rate, 2 * channels * rate, 2 * channels, 16)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data))
    return b"RIFF" + struct.pack("<I", 4 + len(chunks) + len(data)) + b"WAVE" + chunks + data
