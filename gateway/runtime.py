"""Everything one gateway process owns: config, replicas, router, client, background loops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack

import aiohttp

from gateway.admin.fleet import Fleet
from gateway.admin.keys import ReloadableKeys
from gateway.config import GatewayConfig, ReplicaConfig
from gateway.config_loader import ConfigError
from gateway.proxy.admission import Admission
from gateway.proxy.affinity import Affinity
from gateway.proxy.http_client import Http1Upstream
from gateway.proxy.pipeline import Pipeline
from gateway.proxy.tenancy import Tenancy
from gateway.proxy.upstream import make_session
from gateway.replicas.gpu import Nvml
from gateway.replicas.health import HealthChecker
from gateway.replicas.kv_subscriber import KvEventSubscriber
from gateway.replicas.load_probe import LoadProbe
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.score_loop import ScoreLoop
from gateway.replicas.state import ReplicaState
from gateway.shared_state.quota import RedisQuotaStore
from gateway.shared_state.state import SharedState
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

    def __init__(self, config: GatewayConfig, worker_index: int = 0, worker_count: int = 1) -> None:
        self.config = config
        # This process's slot among the `--workers` processes on this host (0 of 1: alone).
        self.worker_index = worker_index
        self.worker_count = worker_count
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
        # Routing state shared with other gateway processes through Redis ([shared_state]).
        self.shared_state: SharedState | None = None
        store: RedisQuotaStore | None = None
        if config.shared_state.enabled:
            self.shared_state = SharedState(config.shared_state, self.affinity, self.pool)
            self.affinity.on_record = self.shared_state.on_record
            self.pool.on_ejection = self.shared_state.queue_ejection
            self.metrics.track_shared_state(self.shared_state.stats_row)
            if config.shared_state.quotas:
                store = RedisQuotaStore(self.shared_state)
        # Tenants: keys, trusted sources, queue lanes and quotas (one "default" tenant unset).
        server = config.server
        self.tenancy = Tenancy(
            config.tenancy, server.api_keys, server.admin_keys, self.metrics.quota_refused, store
        )
        self.metrics.track_tenant_queues(lambda: self.tenancy.queue_depth(self.admission))
        self.draining = False
        # Called when the drain period is over: each front end ends its open streams cleanly.
        self.stream_cutters: list[Callable[[], None]] = []
        self._stack = AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._pipeline: Pipeline | None = None
        # The TOML file this process was started from (serve -c): what a reload re-reads.
        self.config_path: str | None = None
        # Admin keys, replaced in place on reload: the front ends hold this very object.
        self.admin_keys = ReloadableKeys(config.server.admin_keys)
        # Live fleet changes (admin API, reload, discovery), one at a time.
        self.fleet = Fleet(self)
        self._tg: asyncio.TaskGroup | None = None
        self._replica_tasks: dict[str, list[asyncio.Task[None]]] = {}

    @property
    def pipeline(self) -> Pipeline:
        assert self._pipeline is not None, "runtime not started"
        return self._pipeline

    @property
    def session(self) -> aiohttp.ClientSession:
        """The process's one aiohttp session (loops, and /v1/realtime's upstream sockets)."""
        assert self._session is not None, "runtime not started"
        return self._session

    async def start(self) -> None:
        session = make_session(self.config.upstream)
        self._session = session
        # The requests' own client (the loops below keep aiohttp): see proxy/http_client.py.
        self._upstream = Http1Upstream(self.config.upstream)
        self._pipeline = Pipeline(
            self.config,
            self.pool,
            self.router,
            self._upstream,
            self.metrics,
            self.affinity,
            self.admission,
            self.tracing,
            self.tenancy,
        )
        if self.shared_state is not None:
            # Each process's share window counts every process's picks (shared_state/picks.py);
            # through self.router at call time, which a reload replaces.
            self._pipeline.on_pick = self.shared_state.picks.add
            self.shared_state.picks.observe = lambda *pick: self.router.observe(*pick)
        checker = HealthChecker(self.config.health_check, session, self.pool)
        # One process scrapes each replica for every process sharing state ([shared_state]).
        leases = self.shared_state.scrapes if self.shared_state is not None else None
        scores = ScoreLoop(
            self.config.score_loop,
            session,
            self.affinity.prefixes.set_capacity,
            self.admission.notify if self.admission is not None else lambda: None,
            on_restart=self._replica_restarted,
            on_preemptions=self.pool.preempted,
            workers=self.worker_count,
            share=leases,
        )
        if leases is not None:
            leases.on_result = scores.apply_remote
        # One probe and scrape round before serving: a healthy fleet is routable, with load
        # figures, from the first request.
        await asyncio.gather(*(checker.probe(r) for r in self.pool))
        await asyncio.gather(*(scores.scrape(r) for r in self.pool))
        self._tg = tg = asyncio.TaskGroup()
        await self._stack.enter_async_context(tg)
        self._checker, self._scores = checker, scores
        self.loads = LoadProbe(self.config.score_loop, session)
        self.kv_events = KvEventSubscriber(self.affinity.prefixes, session)
        for replica in self.pool:
            self._start_loops(replica)
        self._tasks.extend(self.fleet.start_discovery(tg))
        if self.config.score_loop.nvml == "auto" and any(r.config.gpu_indices for r in self.pool):
            self.nvml = Nvml()
            if self.nvml.available:
                self._tasks.append(tg.create_task(self.nvml.run(self.pool)))
        if self.shared_state is not None:
            await self.shared_state.start()
        log.info(
            "routing profile %r over %d replicas (%d healthy)",
            self.router.profile_name,
            len(self.pool.replicas),
            sum(r.healthy for r in self.pool),
        )

    def _start_loops(self, replica: ReplicaState) -> None:
        assert self._tg is not None, "runtime not started"
        tg = self._tg
        tasks = [tg.create_task(self._health_loop(self._checker, replica))]
        tasks.append(tg.create_task(self._scores.run(replica)))
        if self.loads.enabled:
            tasks.append(tg.create_task(self.loads.run(replica)))
        if replica.config.kv_events:
            tasks.append(tg.create_task(self.kv_events.run(replica)))
        self._replica_tasks[replica.name] = tasks

    async def add_replica(self, cfg: ReplicaConfig, slow_start: bool) -> ReplicaState:
        """A replica joins live: probed and scraped once, then its loops run in the task group."""
        sl = self.config.score_loop
        replica = ReplicaState(cfg, sl.stale_after_s, sl.heartbeat_stale_s)
        self.pool.add(replica, slow_start)
        await self._checker.probe(replica)
        await self._scores.scrape(replica)
        self._start_loops(replica)
        return replica

    async def remove_replica(self, name: str) -> None:
        """Its loops stop, what it cached is forgotten, it leaves the pool (drained first)."""
        tasks = self._replica_tasks.pop(name, [])
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        self.affinity.forget_replica(name)
        self.pool.remove(name)

    def swap(self, config: GatewayConfig, router: Router) -> None:
        """New requests see `config`'s per-request keys and `router`; routed ones keep theirs."""
        self.config, self.router = config, router
        # The pipeline reads both per request: one assignment each, nothing to lock.
        self.pipeline._router, self.pipeline._cfg = router, config.upstream

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
        for tasks in self._replica_tasks.values():
            for task in tasks:
                task.cancel()
        await self._stack.aclose()
        if self.shared_state is not None:
            await self.shared_state.stop()
        if self._session is not None:
            await self._session.close()
            await self._upstream.client.close()
        if self.tracing is not None:
            # Flushes the last spans: a blocking HTTP export, kept off the event loop.
            await asyncio.to_thread(self.tracing.shutdown)
