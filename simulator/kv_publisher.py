"""ZMQ publisher of KV-cache events, framed exactly as vLLM 0.32's ZmqEventPublisher."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence

import zmq
import zmq.asyncio

from vllm_api.kv_events import EventBatch, KvEvent, encode_batch, encode_seq

END_SEQ = encode_seq(-1)


def binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard (or ipc/inproc) endpoint is bound, anything else connected."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KvPublisher:
    """PUB socket: frames (topic, 8-byte big-endian seq, msgpack batch); optional replay ROUTER."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        topic: str,
        *,
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        data_parallel_rank: int | None = 0,
    ) -> None:
        self._ctx = ctx
        self._topic = topic.encode()
        self._rank = data_parallel_rank
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=max(buffer_steps, 1))
        self._pub: zmq.Socket[bytes] = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        if binds(endpoint):
            self._pub.bind(endpoint)
            self.endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self._pub.connect(endpoint)
            self.endpoint = endpoint
        self.replay_endpoint: str | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        if replay_endpoint is not None:
            actx = zmq.asyncio.Context.shadow(ctx.underlying)
            self._router = actx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(replay_endpoint)
            self.replay_endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)

    def start(self) -> None:
        if self._router is not None:
            self._task = asyncio.create_task(self._serve_replay(), name="sim-kv-replay")

    @property
    def next_seq(self) -> int:
        return self._seq

    def publish(self, events: Sequence[KvEvent]) -> None:
        """Send one batch (one engine step); PUB semantics: drop rather than block."""
        payload = encode_batch(EventBatch(time.time(), tuple(events), self._rank))
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart((self._topic, encode_seq(seq), payload), flags=zmq.NOBLOCK)

    def reset_sequence(self) -> None:
        """Engine restart: numbering starts again at 0 and old batches are not replayable."""
        self._seq = 0
        self._buffer.clear()

    async def _serve_replay(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3:
                continue  # not a DEALER request in vLLM's form; ignore like vLLM does
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")  # unsigned, as vLLM reads it
            # vLLM's replay frames carry the topic: (b"", topic, seq, payload) at the DEALER;
            # the end marker has an empty topic and payload.
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await self._router.send_multipart(
                        (client, b"", self._topic, encode_seq(seq), payload)
                    )
            await self._router.send_multipart((client, b"", b"", END_SEQ, b""))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._router is not None:
            self._router.close(linger=0)
        self._pub.close(linger=0)
