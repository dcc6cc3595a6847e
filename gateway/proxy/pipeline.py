"""The one request pipeline both front ends call: route, attempt, retry before the first byte."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from gateway.config import GatewayConfig
from gateway.errors import (
    GatewayError,
    ModelNotFound,
    NoHealthyReplica,
    UpstreamFailed,
    UpstreamTimeout,
)
from gateway.proxy.admission import Admission, RateLimited
from gateway.proxy.affinity import Affinity
from gateway.proxy.decision_log import decision_line
from gateway.proxy.headers import upstream_request_headers
from gateway.proxy.requests import ParsedRequest
from gateway.proxy.upstream import Exchange, Upstream, UpstreamResponse
from gateway.replicas.pool import Lease, ReplicaPool
from routing.router import Router
from routing.types import Branch, Decision, NoReplicaError, RequestFeatures
from telemetry.metrics import GatewayMetrics
from telemetry.tracing import RequestTrace, Tracing, end_attempt, inject_headers

log = logging.getLogger("llm_gateway.pipeline")
# One DEBUG line per routing decision (see README, Observability): its own logger, so it can be
# turned on without the rest of the pipeline's debug output.
decision_log = logging.getLogger("llm_gateway.decision")

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# An error body from a failing replica is read only to be logged, and only this much of it.
_ERROR_BODY_LOG_LIMIT = 512


class _Retryable(Exception):
    """An attempt failed before any byte reached the client; another replica may serve it."""

    def __init__(self, reason: str, client_error: GatewayError) -> None:
        super().__init__(reason)
        self.reason = reason
        self.client_error = client_error


class Pipeline:
    """Routes a parsed request and opens an upstream exchange, retrying on other replicas."""

    def __init__(
        self,
        config: GatewayConfig,
        pool: ReplicaPool,
        router: Router,
        upstream: Upstream,
        metrics: GatewayMetrics,
        affinity: Affinity,
        admission: Admission | None,
        tracing: Tracing | None = None,
    ) -> None:
        self._tracing = tracing
        self._affinity = affinity
        self._admission = admission
        self._cfg = config.upstream
        self._passive_threshold = config.health_check.passive_failure_threshold
        self._pool = pool
        self._router = router
        self._upstream = upstream
        self._transport_errors = upstream.transport_errors
        self._metrics = metrics

    def check_model(self, model: str) -> None:
        """404 for a model no replica has ever served, as vLLM does for its own models."""
        known = self._pool.known_models()
        if model in known:
            return
        if not known:
            # Nothing discovered yet (all replicas down since start): unknown looks like down.
            raise NoHealthyReplica("No replica is available to serve this request.")
        raise ModelNotFound(model)

    async def open(
        self, req: ParsedRequest, client_headers: list[tuple[bytes, bytes]], started: float
    ) -> Exchange:
        """Return an exchange holding the first upstream byte, or raise a client-safe error."""
        tracing = self._tracing
        rtrace = tracing.start(req.kind, client_headers, req.request_id) if tracing else None
        try:
            exchange = await self._open(req, client_headers, started, rtrace)
        except GatewayError as err:
            # Refused requests count too; an unknown model name must not mint a label.
            model = req.model if req.model in self._pool.known_models() else "_unknown"
            branch = Branch.QUEUED if isinstance(err, RateLimited) else Branch.NONE
            self._metrics.request_done(model, "", err.status, branch, time.perf_counter() - started)
            if rtrace is not None:
                rtrace.end(err.status)
            raise
        except BaseException:
            if rtrace is not None:
                rtrace.end(499)  # the client went away (nginx's code for it)
            raise
        exchange.trace = rtrace
        return exchange

    async def _open(
        self,
        req: ParsedRequest,
        client_headers: list[tuple[bytes, bytes]],
        started: float,
        rtrace: RequestTrace | None,
    ) -> Exchange:
        self.check_model(req.model)
        headers = upstream_request_headers(client_headers, req.request_id, self._cfg.api_key)
        features = await self._affinity.features_off_loop(req, client_headers)
        # Once per request: with DEBUG off a decision costs no formatting at all.
        debug = decision_log.isEnabledFor(logging.DEBUG)
        tried: list[str] = []
        last: GatewayError | None = None
        for attempt in range(1 + self._cfg.max_retries):
            try:
                if attempt == 0:
                    decision, waited = await self._first_route(features)
                else:
                    decision = self._router.route(features, self._pool.snapshots(), tried)
                    waited = False
            except NoReplicaError as exc:
                if last is not None:
                    raise last from None
                log.info("no replica for %s: %s", req.model, exc.reason)
                raise NoHealthyReplica(
                    f"No healthy replica is serving model `{req.model}`."
                ) from None
            routed = decision.branch
            if waited:
                decision = replace(decision, branch=Branch.QUEUED)
            name = decision.replica.name
            self._metrics.decision(name, decision.branch)
            if debug:
                decision_log.debug(
                    "%s",
                    decision_line(
                        self._router, req, features, decision, attempt + 1, tried, routed
                    ),
                )
            lease = self._pool.acquire(name)
            replica = lease.replica
            # Counted as queued prefill on the replica until its first byte arrives.
            # The prefill it will cost there: the part of the prompt that replica doesn't hold.
            cached = features.prefix_match.get(name, 0) * features.block_tokens
            prefill = max(0, features.prompt_tokens - cached)
            replica.queued_prefill_tokens += prefill
            span, sent = None, headers
            if rtrace is not None:
                span, carrier = rtrace.attempt(
                    name, decision.replica.url, attempt + 1, decision.branch, decision.total
                )
                sent = inject_headers(headers, carrier)
            try:
                exchange = await self._attempt(req, sent, decision, lease, started)
                if exchange.status < 400:
                    self._affinity.record(features, name)
                    # Only this replica's entry grew; another's may shrink when the index's
                    # total bound evicts, and is then stale until it is next routed to.
                    replica.cached_blocks = self._affinity.prefixes.blocks(name)
                if span is not None:
                    end_attempt(span, "ok")
                return exchange
            except _Retryable as failure:
                if span is not None:
                    end_attempt(span, failure.reason)
                self._release(lease, False)
                log.warning(
                    "request %s: replica %s failed before first byte (%s)",
                    req.request_id,
                    name,
                    failure.reason,
                )
                self._metrics.retry(name, failure.reason)
                tried.append(name)
                last = failure.client_error
            except BaseException:
                # Client gone or server stopping: not the replica's fault.
                if span is not None:
                    end_attempt(span, "cancelled")
                self._release(lease, True)
                raise
            finally:
                replica.queued_prefill_tokens -= prefill
        assert last is not None
        raise last

    async def _first_route(self, features: RequestFeatures) -> tuple[Decision, bool]:
        """Route, or wait in the admission queue while every replica is saturated."""
        pool, router = self._pool, self._router
        if self._admission is None:
            return router.route(features, pool.snapshots()), False
        return await self._admission.admit(
            features, lambda: router.route(features, pool.snapshots())
        )

    def _release(self, lease: Lease, ok: bool) -> None:
        lease.release(ok, self._passive_threshold)
        if self._admission is not None:
            self._admission.notify()

    async def _attempt(
        self,
        req: ParsedRequest,
        headers: dict[str, str],
        decision: Decision,
        lease: Lease,
        started: float,
    ) -> Exchange:
        url = decision.replica.url + _PATHS[req.kind]
        budget = self._cfg.first_byte_timeout_s if req.stream else self._cfg.non_stream_timeout_s
        resp: UpstreamResponse | None = None
        try:
            async with asyncio.timeout(budget):
                resp = await self._upstream.post(url, req.body, headers)
                if resp.status >= 500:
                    detail = (await resp.content.read(_ERROR_BODY_LOG_LIMIT)).decode(
                        "utf-8", "replace"
                    )
                    log.warning(
                        "replica %s answered %d: %s", lease.replica.name, resp.status, detail
                    )
                    raise _Retryable(
                        f"status_{resp.status}",
                        UpstreamFailed(
                            f"The model server failed to serve the request (HTTP {resp.status}).",
                            status=resp.status if resp.status in (502, 503, 504) else 502,
                        ),
                    )
                streaming = req.stream and resp.status == 200
                if streaming:
                    first = await resp.content.readany()
                    if not first:
                        raise _Retryable(
                            "empty_stream", UpstreamFailed("The model server closed the stream.")
                        )
                else:
                    first = await resp.read()
        except TimeoutError:
            if resp is not None:
                resp.close()
            raise _Retryable(
                "timeout", UpstreamTimeout("The model server did not answer in time.")
            ) from None
        except self._transport_errors as exc:
            if resp is not None:
                resp.close()
            raise _Retryable(
                type(exc).__name__,
                UpstreamFailed("The model server could not be reached."),
            ) from None
        except BaseException:
            if resp is not None:
                resp.close()
            raise
        exchange = Exchange(
            lease=lease,
            decision=decision,
            response=resp,
            status=resp.status,
            first=first,
            streaming=streaming,
            idle_timeout_s=self._cfg.idle_timeout_s,
            started=started,
            transport_errors=self._transport_errors,
            complete=not streaming,
        )
        if streaming:
            self._metrics.first_token(req.model, exchange.first_byte_at - started)
        return exchange

    def finish(self, req: ParsedRequest, exchange: Exchange, status: int, ok: bool) -> None:
        """Close the upstream side and feed the outcome back: exactly once per exchange."""
        exchange.close()
        self._release(exchange.lease, ok)
        if exchange.trace is not None:
            exchange.trace.set(
                model=req.model,
                replica=exchange.lease.replica.name,
                branch=exchange.decision.branch,
                stream=req.stream,
                priority=req.features.priority,
                **({"tenant": req.features.tenant} if req.features.tenant else {}),
            )
            exchange.trace.end(status if ok else 502)
        self._metrics.request_done(
            req.model,
            exchange.lease.replica.name,
            status,
            exchange.decision.branch,
            time.perf_counter() - exchange.started,
        )
