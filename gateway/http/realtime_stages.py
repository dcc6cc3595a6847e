"""A /v1/realtime session on the request pipeline's stages, as an HTTP request goes through them.

At the upgrade: the key's tenant and the class (`proxy/tenancy.py`, over `proxy/hints.py`'s
headers: x-tenant-id from a trusted source, x-priority, x-model-hint, x-canary-weight), then
the tenant's quota (`proxy/quota.py`): one concurrency slot held for the session's whole life,
one request of its requests_per_minute, and a reservation of `default_completion_tokens`
against tokens_per_minute. Once the model is named: its version (`proxy/versions.py`, sticky on
the session header like a chat), then the first routing through the admission queue
(`Pipeline.admit`) in the tenant's lane and class, in the shortest length bucket (a session
has no prompt). When it ends: the quota settles with the sum of the `usage.total_tokens` of
vLLM's `transcription.done` events (vLLM reports usage once per utterance; an utterance cut
before its done goes uncounted; none seen: the reservation stands, as for an HTTP stream
without a usage chunk), and the trace's server span and the request log's record end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cache_index.admission_queue import bucket_of
from gateway.logs import RequestLog, RequestRecord
from gateway.proxy import hints
from gateway.proxy.requests import ParsedRequest, with_features
from gateway.proxy.tenancy import Grant
from gateway.proxy.tenancy_config import DEFAULT_TENANT
from gateway.runtime import Runtime
from routing.types import Branch, RequestFeatures
from telemetry.tracing import RequestTrace

SPAN_NAME = "GET /v1/realtime"
# The status a session's record and span carry once the upgrade was accepted.
SWITCHED = 101


@dataclass(frozen=True, slots=True)
class SessionRecord(RequestRecord):
    """A realtime session's request-log record: a request's fields and how the socket ended."""

    outcome: str = ""
    # The close code the client got (None: it left first, or it was refused before).
    close_code: int | None = None
    # Frames relayed from the client to the replica, and back.
    frames_in: int = 0
    frames_out: int = 0


class Tally:
    """What the relay counts while it runs: frames each way, usage the replica reported."""

    __slots__ = ("frames_in", "frames_out", "usage_tokens")

    def __init__(self) -> None:
        self.frames_in = 0
        self.frames_out = 0
        self.usage_tokens: int | None = None

    def usage(self, total_tokens: int) -> None:
        self.usage_tokens = (self.usage_tokens or 0) + total_tokens


class Session:
    """One session's state through the stages; `SessionStages.end` closes it exactly once."""

    __slots__ = (
        "branch",
        "ended",
        "features",
        "grant",
        "model",
        "replica",
        "request_id",
        "started",
        "tally",
        "trace",
    )

    def __init__(
        self,
        request_id: str,
        started: float,
        features: RequestFeatures,
        trace: RequestTrace | None,
    ) -> None:
        self.request_id = request_id
        self.started = started
        self.features = features
        self.trace = trace
        self.grant: Grant | None = None
        # The model the replicas serve (after the version stage); "" until it is named.
        self.model = ""
        self.replica = ""
        self.branch: str = Branch.NONE
        self.tally = Tally()
        self.ended = False


class SessionStages:
    """The pipeline's stages for realtime sessions of one gateway process."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._log = RequestLog(runtime.config.telemetry.request_log)
        # No prompt: the shortest requests' bucket of the admission queue.
        self._bucket = bucket_of(runtime.affinity.buckets, 0)

    def begin(
        self,
        headers: list[tuple[bytes, bytes]],
        tenant: str,
        peer: str | None,
        request_id: str,
        started: float,
    ) -> Session:
        """The session's tenant, class and hints bound (400 on a malformed hint); traced."""
        runtime = self._runtime
        found = hints.from_headers(headers)
        features = RequestFeatures(model="", request_id=request_id, stream=True)
        features = with_features(features, bucket=self._bucket)
        # A bodiless request only so that the hints and the tenant bind as for HTTP.
        req = ParsedRequest("transcription", b"", {}, "", True, request_id, features)
        req = runtime.tenancy.bind(hints.apply(req, found), tenant, found, peer)
        tracing = runtime.tracing
        trace = tracing.start("realtime", headers, request_id, SPAN_NAME) if tracing else None
        return Session(request_id, started, req.features, trace)

    async def reserve(self, session: Session) -> None:
        """Reserve the session against its tenant's quota (429 with Retry-After over it)."""
        session.grant = await self._runtime.tenancy.reserve(session.features)

    def bind_model(self, session: Session, model: str, headers: list[tuple[bytes, bytes]]) -> str:
        """The model's version for this session; the name its replicas serve (404 unknown)."""
        pipeline = self._runtime.pipeline
        features = with_features(session.features, model=model)
        features = pipeline.traffic.choose_session(model, headers, features)
        pipeline.check_model(features.model)
        session.features = features
        session.model = features.model
        return features.model

    def end(self, session: Session, status: int, outcome: str, close_code: int | None) -> None:
        """Settle the quota, end the span, write the record: once, however the session ended."""
        if session.ended:
            return
        session.ended = True
        runtime = self._runtime
        tally = session.tally
        if session.grant is not None:
            runtime.tenancy.settle(session.grant, tally.usage_tokens)
        features = session.features
        tenant = features.tenant or DEFAULT_TENANT
        model = session.model or "_unknown"
        duration = time.perf_counter() - session.started
        if session.trace is not None:
            session.trace.set(
                model=model,
                replica=session.replica,
                branch=session.branch,
                tenant=tenant,
                priority=runtime.tenancy.priority(features),
                outcome=outcome,
                close_code=close_code if close_code is not None else 0,  # 0: none sent
                frames_in=tally.frames_in,
                frames_out=tally.frames_out,
                duration_s=duration,
            )
            session.trace.end(status)
        self._log.done(
            SessionRecord(
                request_id=session.request_id,
                tenant=tenant,
                model=model,
                replica=session.replica,
                branch=str(session.branch),
                status=status,
                stream=True,
                ttft_s=None,
                prompt_tokens=None,
                usage_tokens=tally.usage_tokens,
                duration_s=duration,
                outcome=outcome,
                close_code=close_code,
                frames_in=tally.frames_in,
                frames_out=tally.frames_out,
            )
        )
