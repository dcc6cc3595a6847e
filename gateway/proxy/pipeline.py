"""The one request pipeline both front ends call: route, attempt, retry before the first byte."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from cache_index.response_index import ResponseIndex
from gateway.config import GatewayConfig
from gateway.errors import GatewayError, ModelNotFound, NoHealthyReplica
from gateway.logs import RequestLog, RequestRecord
from gateway.proxy.admission import DEFAULT_LANE, Admission, RateLimited
from gateway.proxy.affinity import Affinity
from gateway.proxy.attempt import Retryable, try_replica
from gateway.proxy.decision_log import decision_line
from gateway.proxy.headers import upstream_request_headers
from gateway.proxy.requests import STORED_KINDS, ParsedRequest
from gateway.proxy.responses_route import ResponseNotFound, ResponseReplicaGone
from gateway.proxy.tenancy import Grant, Tenancy
from gateway.proxy.tenancy_config import DEFAULT_TENANT
from gateway.proxy.upstream import Exchange, Upstream
from gateway.proxy.versions import Traffic
from gateway.replicas.pool import Lease, ReplicaPool
from routing.router import Router
from routing.types import Branch, Decision, NoReplicaError, RequestFeatures
from telemetry.metrics import GatewayMetrics
from telemetry.tracing import RequestTrace, Tracing, end_attempt, inject_headers

log = logging.getLogger("llm_gateway.pipeline")
# One DEBUG line per routing decision (see README, Observability): its own logger, so it can be
# turned on without the rest of the pipeline's debug output.
decision_log = logging.getLogger("llm_gateway.decision")


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
        tenancy: Tenancy | None = None,
    ) -> None:
        self._tracing = tracing
        # Tenants' queues and quotas; None: one tenant, no quota.
        self._tenancy = tenancy
        self._affinity = affinity
        self._admission = admission
        self._cfg = config.upstream
        # The pipeline feeds the outlier policy its outcomes, so it sets the policy up (the
        # runtime and the test rig build the pool without it).
        pool.configure_outlier(config.outlier)
        self._pool = pool
        # Retry attempts in flight now, against the retry budget.
        self._retrying = 0
        self._router = router
        self._upstream = upstream
        self._metrics = metrics
        # Model versions, instance-class labels and vLLM priorities (gateway/proxy/versions.py).
        classes = tenancy.priority if tenancy is not None else None
        self._traffic = Traffic(config, metrics.model_version, classes)
        # Stored Responses live in one replica's memory: their follow-ups must go back there.
        self.responses = ResponseIndex(config.cache_index.max_responses)
        # One record per request on llm_gateway.request ([telemetry] request_log).
        self._request_log = RequestLog(config.telemetry.request_log)
        # Told each pick the router's share window counted: (replica, new conversation, prefix
        # joined); the shared state tells the other processes (None: this process alone).
        self.on_pick: Callable[[str, bool, int | None], None] | None = None

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
        tenancy = self._tenancy
        grant: Grant | None = None
        try:
            if tenancy is not None:
                grant = await tenancy.reserve(req.features)
            exchange = await self._open(req, client_headers, started, rtrace)
        except GatewayError as err:
            if tenancy is not None and grant is not None:
                tenancy.settle(grant, 0)  # no replica served it: refunded
            # Refused requests count too; an unknown model name must not mint a label.
            model = req.model if req.model in self._pool.known_models() else "_unknown"
            branch = Branch.QUEUED if isinstance(err, RateLimited) else Branch.NONE
            elapsed = time.perf_counter() - started
            self._metrics.request_done(model, "", err.status, branch, elapsed)
            if self._request_log.enabled:
                self._log_request(req, "", branch, err.status, None, None, elapsed)
            if rtrace is not None:
                rtrace.end(err.status)
            raise
        except BaseException:
            if tenancy is not None and grant is not None:
                tenancy.settle(grant, 0)
            if rtrace is not None:
                rtrace.end(499)  # the client went away (nginx's code for it)
            raise
        exchange.trace = rtrace
        exchange.grant = grant
        exchange.want_usage |= self._request_log.enabled
        return exchange

    async def _open(
        self,
        req: ParsedRequest,
        client_headers: list[tuple[bytes, bytes]],
        started: float,
        rtrace: RequestTrace | None,
    ) -> Exchange:
        req = self._traffic.choose(req, client_headers)
        # A stored response's replica is the only one that can serve it: no routing, no retry.
        pinned = None if req.response_id is None else self._pinned(req.response_id)
        if pinned is None or req.kind == "responses":
            self.check_model(req.model)
        headers = upstream_request_headers(client_headers, req.request_id, self._cfg.api_key)
        features = await self._affinity.features_off_loop(req, client_headers)
        # Once per request: with DEBUG off a decision costs no formatting at all.
        debug = decision_log.isEnabledFor(logging.DEBUG)
        tried: list[str] = []
        last: GatewayError | None = None
        # A retry after a refused connection is exempt from the budget, which exists to keep
        # retries from multiplying the replicas' load: the refused attempt put none on them.
        unsent = False
        for attempt in range(1 if pinned is not None else 1 + self._cfg.max_retries):
            if attempt and not unsent and not self._retry_allowed():
                assert last is not None
                self._metrics.retry_refused()
                raise last
            try:
                if pinned is not None:
                    decision, waited = pinned, False
                elif attempt == 0:
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
            decision = self._traffic.relabel(features, decision)
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
            if pinned is None:
                self._tell_pick(name)
            lease = self._pool.acquire(name)
            if self._router.reads_inflight:  # else nothing reads them: not kept
                self._affinity.inflight.add(id(lease), name, features.block_hashes)
            replica = lease.replica
            retry = attempt > 0 and not unsent
            self._retrying += retry
            # Counted as queued prefill on the replica until its first byte arrives.
            # The prefill it will cost there: the part of the prompt that replica doesn't hold.
            held = max(features.prefix_match.get(name, 0), features.inflight_match.get(name, 0))
            cached = held * features.block_tokens
            prefill = max(0, features.prompt_tokens - cached)
            replica.queued_prefill_tokens += prefill
            span, sent = None, headers
            if rtrace is not None:
                span, carrier = rtrace.attempt(
                    name, decision.replica.url, attempt + 1, decision.branch, decision.total
                )
                sent = inject_headers(headers, carrier)
            try:
                exchange = await try_replica(
                    self._upstream, self._cfg, self._traffic, req, sent, decision, lease, started
                )
                if exchange.streaming:
                    self._metrics.first_token(req.model, exchange.first_byte_at - started)
                if exchange.status < 400:
                    exchange.features = features
                    exchange.want_usage |= self._affinity.wants_usage(features)
                    self._affinity.record(features, name)
                    # Only this replica's entry grew; another's may shrink when the index's
                    # total bound evicts, and is then stale until it is next routed to.
                    replica.cached_blocks = self._affinity.prefixes.blocks(name)
                if span is not None:
                    end_attempt(span, "ok")
                return exchange
            except Retryable as failure:
                if span is not None:
                    end_attempt(span, failure.reason)
                self._release(lease, False, failure.detail)
                log.warning(
                    "request %s: replica %s failed before first byte (%s)",
                    req.request_id,
                    name,
                    failure.reason,
                )
                self._metrics.retry(name, failure.reason)
                tried.append(name)
                last, unsent = failure.client_error, failure.unsent
            except BaseException:
                # Client gone or server stopping: not the replica's fault.
                if span is not None:
                    end_attempt(span, "cancelled")
                self._release(lease, None)
                raise
            finally:
                replica.queued_prefill_tokens -= prefill
                self._retrying -= retry
        assert last is not None
        raise last

    def _pinned(self, response_id: str) -> Decision:
        """The replica storing `response_id`; 404 unknown, 410 left the fleet, 503 down."""
        name = self.responses.get(response_id)
        if name is None:
            raise ResponseNotFound(response_id)
        snapshot = next((s for s in self._pool.snapshots() if s.name == name), None)
        if snapshot is None:
            raise ResponseReplicaGone(response_id, name)
        if not snapshot.healthy:
            raise NoHealthyReplica(
                f"The replica `{name}` that stores response '{response_id}' is down."
            )
        return Decision(snapshot, Branch.SESSION, 0.0, {}, 1)

    async def _first_route(self, features: RequestFeatures) -> tuple[Decision, bool]:
        """Route, or wait in the admission queue while every replica is saturated."""
        pool, router = self._pool, self._router
        if self._admission is None:
            return router.route(features, pool.snapshots()), False
        # Each tenant its own queue, weight and class (one lane for all without tenancy).
        lane = self._tenancy.lane(features) if self._tenancy is not None else DEFAULT_LANE
        return await self._admission.admit(
            features, lambda: router.route(features, pool.snapshots()), lane
        )

    # Seams for /v1/realtime (gateway/http/realtime_stages.py), which routes without `open`.
    @property
    def traffic(self) -> Traffic:
        return self._traffic

    async def admit(self, features: RequestFeatures) -> tuple[Decision, bool]:
        """`open`'s first routing (the admission queue while saturated): (decision, waited)."""
        decision, waited = await self._first_route(features)
        self._tell_pick(decision.replica.name)
        return decision, waited

    def _tell_pick(self, name: str) -> None:
        """The router's last pick (of `name`) to the other processes' share windows, if any."""
        if self.on_pick is not None and (share := self._router.last_share()) is not None:
            self.on_pick(name, *share)

    def release(self, lease: Lease, ok: bool | None, detail: str = "") -> None:
        """Release a lease taken outside `open`, waking the admission queue."""
        self._release(lease, ok, detail)

    def retry_allowed(self) -> bool:
        """Whether the retry budget lets one more retry start (counted by `retrying`)."""
        return self._retry_allowed()

    def retrying(self, delta: int) -> None:
        """A retry outside `open` started (+1) or ended (-1): the budget counts it."""
        self._retrying += delta

    def _retry_allowed(self) -> bool:
        """Envoy's retry budget: retries in flight stay within a share of active requests."""
        cfg = self._cfg
        # Attempts in flight, and this request (its failed attempt's lease is released).
        active = sum(r.in_flight for r in self._pool) + 1
        allowed = max(cfg.min_retry_concurrency, cfg.retry_budget_ratio * active)
        return self._retrying + 1 <= allowed

    def _release(self, lease: Lease, ok: bool | None, detail: str = "") -> None:
        # ok None: neither outcome (the client left, the gateway stops), not the replica's.
        lease.release(ok, detail)
        self._affinity.inflight.remove(id(lease))
        if self._admission is not None:
            self._admission.notify()

    def finish(self, req: ParsedRequest, exchange: Exchange, status: int, ok: bool) -> None:
        """Close the upstream side and feed the outcome back: exactly once per exchange."""
        exchange.close()
        self._release(exchange.lease, ok)
        features = exchange.features
        if features is not None and features.prompt_chars and exchange.want_usage:
            counted = exchange.prompt_tokens()
            if counted:
                self._affinity.observe_usage(features, counted)
        tenancy = self._tenancy
        if exchange.grant is not None and tenancy is not None:
            # The answer's own usage; a stream without a usage chunk keeps its reservation.
            # A stored response's GET or cancel echoes the usage it was charged for already.
            stored = req.kind in STORED_KINDS
            tenancy.settle(exchange.grant, 0 if stored else exchange.used_tokens())
        if exchange.trace is not None:
            exchange.trace.set(
                model=req.model,
                replica=exchange.lease.replica.name,
                branch=exchange.decision.branch,
                stream=req.stream,
                priority=tenancy.priority(req.features) if tenancy else req.features.priority,
                tenant=req.features.tenant or DEFAULT_TENANT,
            )
            exchange.trace.end(status if ok else 502)
        elapsed = time.perf_counter() - exchange.started
        self._metrics.request_done(
            req.model, exchange.lease.replica.name, status, exchange.decision.branch, elapsed
        )
        if self._request_log.enabled:
            ttft = exchange.first_byte_at - exchange.started if exchange.streaming else None
            self._log_request(
                req,
                exchange.lease.replica.name,
                exchange.decision.branch,
                status if ok else 502,
                ttft,
                exchange.used_tokens(),
                elapsed,
            )

    def _log_request(
        self,
        req: ParsedRequest,
        replica: str,
        branch: str,
        status: int,
        ttft_s: float | None,
        usage_tokens: int | None,
        duration_s: float,
    ) -> None:
        tokens = req.features.prompt_tokens
        self._request_log.done(
            RequestRecord(
                request_id=req.request_id,
                tenant=req.features.tenant or DEFAULT_TENANT,
                model=req.model,
                replica=replica,
                branch=str(branch),
                status=status,
                stream=req.stream,
                ttft_s=ttft_s,
                prompt_tokens=tokens if tokens else None,
                usage_tokens=usage_tokens,
                duration_s=duration_s,
            )
        )
