"""Everything one gateway process owns: config, replicas, router, client, background loops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack

import aiohttp

from gateway.config import GatewayConfig
from gateway.config_loader import ConfigError
from gateway.proxy.admission import Admission
from gateway.proxy.affinity import Affinity
from gateway.proxy.pipeline import Pipeline
from gateway.proxy.tenancy import Tenancy
from gateway.proxy.upstream import AiohttpUpstream, make_session
from gateway.replicas.gpu import Nvml
from gateway.replicas.health import HealthChecker
from gateway.replicas.kv_subscriber import KvEventSubscriber
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.score_loop import ScoreLoop
from gateway.replicas.state import ReplicaState
from routing.profile import BUILTIN_PROFILES
from routing.router import Router
from routing.types import RoutingError
from telemetry.metrics import GatewayMetrics
from telemetry.tracing import Tracing, TracingSettings

log = logging.getLogger("llm_gateway")


def build_router(config: GatewayConfig) -> Router:
    """The router of the configured profile; plugin errors become ConfigErrors naming the path."""
    profiles = {**BUILTIN_PROFILES, **config.routing.profiles}
    chosen = config.routing.profile
    if chosen not in profiles:
        raise ConfigError(
            f"routing.profile: unknown profile {chosen!r} (known: {', '.join(sorted(profiles))})"
        )
    try:
        return Router(profiles[chosen])
    except RoutingError as exc:
        raise ConfigError(f"routing.profiles.{chosen}: {exc}") from None


class Runtime:
    """Starts and stops the gateway's shared state; the front ends only read it."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.router = build_router(config)
        self.pool = ReplicaPool.from_configs(
            config.replicas,
            stale_after_s=config.score_loop.stale_after_s,
            gpu_stale_s=config.score_loop.heartbeat_stale_s,
        )
        self.nvml: Nvml | None = None
        self.affinity = Affinity(config.cache_index, self.pool.is_lora, config.admission.buckets)
        self.admission = Admission(config.admission) if config.admission.enabled else None
        tel = config.telemetry
        self.tracing: Tracing | None = None
        if tel.tracing_endpoint:
            self.tracing = Tracing(
                TracingSettings(
                    tel.tracing_endpoint, tel.tracing_sample_ratio, tel.tracing_service_name
                )
            )
        self.metrics = GatewayMetrics(
            self.pool.live_rows, self.admission.queue.depth if self.admission else dict
        )
        # Tenants: keys, trusted sources, queue lanes and quotas (one "default" tenant unset).
        server = config.server
        self.tenancy = Tenancy(
            config.tenancy, server.api_keys, server.admin_keys, self.metrics.quota_refused
        )
        self.metrics.track_tenant_queues(lambda: self.tenancy.queue_depth(self.admission))
        self.draining = False
        # Called when the drain period is over: each front end ends its open streams cleanly.
        self.stream_cutters: list[Callable[[], None]] = []
        self._stack = AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._pipeline: Pipeline | None = None

    @property
    def pipeline(self) -> Pipeline:
        assert self._pipeline is not None, "runtime not started"
        return self._pipeline

    async def start(self) -> None:
        session = make_session(self.config.upstream)
        self._session = session
        self._pipeline = Pipeline(
            self.config,
            self.pool,
            self.router,
            AiohttpUpstream(session),
            self.metrics,
            self.affinity,
            self.admission,
            self.tracing,
            self.tenancy,
        )
        checker = HealthChecker(self.config.health_check, session, self.pool)
        scores = ScoreLoop(
            self.config.score_loop,
            session,
            self.affinity.prefixes.set_capacity,
            self.admission.notify if self.admission is not None else lambda: None,
            on_restart=self._replica_restarted,
            on_preemptions=self.pool.preempted,
        )
        # One probe and scrape round before serving: a healthy fleet is routable, with load
        # figures, from the first request.
        await asyncio.gather(*(checker.probe(r) for r in self.pool))
        await asyncio.gather(*(scores.scrape(r) for r in self.pool))
        tg = asyncio.TaskGroup()
        await self._stack.enter_async_context(tg)
        for replica in self.pool:
            self._tasks.append(tg.create_task(self._health_loop(checker, replica)))
            self._tasks.append(tg.create_task(scores.run(replica)))
        self.kv_events = KvEventSubscriber(self.affinity.prefixes, session)
        for replica in self.pool:
            if replica.config.kv_events:
                self._tasks.append(tg.create_task(self.kv_events.run(replica)))
        if self.config.score_loop.nvml == "auto" and any(r.config.gpu_indices for r in self.pool):
            self.nvml = Nvml()
            if self.nvml.available:
                self._tasks.append(tg.create_task(self.nvml.run(self.pool)))
        log.info(
            "routing profile %r over %d replicas (%d healthy)",
            self.router.profile_name,
            len(self.pool.replicas),
            sum(r.healthy for r in self.pool),
        )

    def _replica_restarted(self, name: str) -> None:
        """Its KV cache is gone: no tier may send a request there for what it held."""
        self.affinity.forget_replica(name)
        self.pool[name].cached_blocks = self.affinity.prefixes.blocks(name)

    async def _health_loop(self, checker: HealthChecker, replica: ReplicaState) -> None:
        interval = self.config.health_check.interval_s
        while True:
            await asyncio.sleep(interval)
            await checker.probe(replica)

    def begin_drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fail readiness now; end the streams still open after `drain_timeout_s`."""
        if self.draining:
            return
        self.draining = True
        log.info("draining: streams get %.0f s to finish", self.config.server.drain_timeout_s)
        # Signal handlers may run between any two bytecodes: hand over to the loop safely.
        loop.call_soon_threadsafe(
            loop.call_later, self.config.server.drain_timeout_s, self._cut_streams
        )

    def _cut_streams(self) -> None:
        for cut in self.stream_cutters:
            cut()

    async def stop(self) -> None:
        self.draining = True
        for task in self._tasks:
            task.cancel()
        await self._stack.aclose()
        if self._session is not None:
            await self._session.close()
        if self.tracing is not None:
            # Flushes the last spans: a blocking HTTP export, kept off the event loop.
            await asyncio.to_thread(self.tracing.shutdown)
