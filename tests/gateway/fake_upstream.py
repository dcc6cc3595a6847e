"""A scripted Upstream for pipeline tests: no sockets, each replica's answer chosen up front."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

import orjson

from gateway.config import GatewayConfig, ReplicaConfig
from gateway.proxy.admission import Admission
from gateway.proxy.affinity import Affinity
from gateway.proxy.pipeline import Pipeline
from gateway.replicas.pool import ReplicaPool
from gateway.runtime import build_router
from telemetry.metrics import GatewayMetrics
from telemetry.tracing import Tracing

# Where an answer stops making progress: before its headers, before its first byte, or after
# its chunks (an idle stream). Only the pipeline's own deadlines or a cancellation end it.
Hang = Literal["headers", "first_byte", "after_chunks"]


class FakeClientError(Exception):
    """A transport error that is no ConnectionError, as aiohttp's ClientError is not."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What one replica does with one request."""

    status: int = 200
    # The whole body of a non-streamed (or error) answer.
    body: bytes = b'{"ok":true}'
    # A stream's chunks, in order (a 200 to a stream request); none: the stream is empty.
    chunks: tuple[bytes, ...] = (b"data: 1\n\n", b"data: [DONE]\n\n")
    # Raised by post (refused, reset) instead of answering.
    refuse: type[Exception] | None = None
    hang: Hang | None = None
    # Raised by the read after the last chunk: the stream broke after its first byte.
    break_with: type[Exception] | None = None
    headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),)


@dataclass(frozen=True, slots=True)
class Sent:
    """One request as the fake received it."""

    replica: str
    url: str
    body: bytes
    headers: Mapping[str, str]
    method: str = "POST"


async def _hang(waiting: asyncio.Event) -> bytes:
    waiting.set()
    await asyncio.Event().wait()  # never set: ended by a deadline or a cancellation
    raise AssertionError("unreachable")


class FakeResponse:
    """An UpstreamResponse playing one Answer; records how it was read and freed."""

    def __init__(self, answer: Answer, stream: bool, waiting: asyncio.Event) -> None:
        self._answer = answer
        self._waiting = waiting
        self._chunks = list(answer.chunks) if stream and answer.status == 200 else None
        self.status = answer.status
        self.headers: Mapping[str, str] = dict(answer.headers)
        self.read_limits: list[int] = []
        self.released = False
        self.closed = False

    @property
    def content(self) -> FakeResponse:
        return self

    async def readany(self) -> bytes:
        assert self._chunks is not None, "a non-streamed answer is read whole"
        if self._answer.hang == "first_byte":
            return await _hang(self._waiting)
        if self._chunks:
            return self._chunks.pop(0)
        if self._answer.break_with is not None:
            raise self._answer.break_with("stream cut")
        if self._answer.hang == "after_chunks":
            return await _hang(self._waiting)
        return b""

    async def read(self, n: int = -1, /) -> bytes:
        if self._answer.hang == "first_byte":
            return await _hang(self._waiting)
        self.read_limits.append(n)
        return self._answer.body if n < 0 else self._answer.body[:n]

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeUpstream:
    """Answers each replica (by URL host) from its script; a list plays one entry per call.

    `sequence`, when given, answers calls in arrival order whichever replica they go to.
    """

    by_replica: Mapping[str, Answer | Sequence[Answer]] = field(default_factory=dict)
    default: Answer = field(default_factory=Answer)
    sequence: Sequence[Answer] | None = None
    transport_errors: tuple[type[Exception], ...] = (ConnectionError, FakeClientError)
    sent: list[Sent] = field(default_factory=list)
    responses: list[FakeResponse] = field(default_factory=list)
    # Set whenever an answer starts hanging: a test may act on a request stuck upstream.
    waiting: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def calls(self) -> list[str]:
        return [s.replica for s in self.sent]

    def _answer(self, replica: str) -> Answer:
        if self.sequence is not None:
            index = len(self.sent) - 1
            assert index < len(self.sequence), f"unscripted call {index} to {replica}"
            return self.sequence[index]
        script = self.by_replica.get(replica, self.default)
        if isinstance(script, Answer):
            return script
        nth = self.calls.count(replica) - 1
        return script[min(nth, len(script) - 1)]

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> FakeResponse:
        return await self._send("POST", url, body, headers)

    async def get(self, url: str, headers: Mapping[str, str]) -> FakeResponse:
        return await self._send("GET", url, b"", headers)

    async def _send(
        self, method: str, url: str, body: bytes, headers: Mapping[str, str]
    ) -> FakeResponse:
        parts = urlsplit(url)
        replica = parts.hostname or ""
        self.sent.append(Sent(replica, url, body, dict(headers), method))
        answer = self._answer(replica)
        if answer.refuse is not None:
            raise answer.refuse(f"{replica} refused")
        if answer.hang == "headers":
            await _hang(self.waiting)
        if method == "GET":
            stream = "stream=true" in parts.query
        else:
            stream = bool(body) and orjson.loads(body).get("stream") is True
        response = FakeResponse(answer, stream, self.waiting)
        self.responses.append(response)
        return response


def replica_configs(n: int, model: str) -> tuple[ReplicaConfig, ...]:
    """`n` replicas r0, r1, ... serving `model` (their URLs are only the fake's keys)."""
    return tuple(
        ReplicaConfig(url=f"http://r{i}:8000", name=f"r{i}", models=(model,)) for i in range(n)
    )


@dataclass
class PipelineRig:
    """A Pipeline over healthy replicas and a FakeUpstream, with what the tests inspect."""

    pipeline: Pipeline
    pool: ReplicaPool
    metrics: GatewayMetrics
    upstream: FakeUpstream
    admission: Admission | None = None

    def in_flight(self) -> dict[str, int]:
        return {r.name: r.in_flight for r in self.pool}

    def idle(self) -> bool:
        """No lease is held and no prefill is counted anywhere."""
        return all(r.in_flight == 0 and r.queued_prefill_tokens == 0 for r in self.pool)

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def retries(self, replica: str, reason: str) -> float:
        return self.sample("llm_gateway_upstream_retries_total", replica=replica, reason=reason)


def pipeline_rig(
    upstream: FakeUpstream,
    cfg: GatewayConfig,
    admission: bool = False,
    tracing: Tracing | None = None,
) -> PipelineRig:
    """The pipeline the runtime would build from `cfg`, every replica healthy, no sockets."""
    pool = ReplicaPool.from_configs(cfg.replicas)
    for replica in pool:
        replica.healthy = True
    metrics = GatewayMetrics(pool.live_rows)
    affinity = Affinity(cfg.cache_index, pool.is_lora, cfg.admission.buckets)
    queue = Admission(cfg.admission) if admission else None
    pipeline = Pipeline(cfg, pool, build_router(cfg), upstream, metrics, affinity, queue, tracing)
    return PipelineRig(pipeline, pool, metrics, upstream, queue)
