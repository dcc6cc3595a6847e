"""Live state of one replica as the gateway sees it: health, models, load, scraped signals."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.config import ReplicaConfig
from routing.types import ReplicaSnapshot
from vllm_api.metrics import VllmMetrics

# A scrape `stale_after` late loses trust linearly from there, to none this many times later.
_STALE_SPAN = 4.0


@dataclass(slots=True)
class ReplicaState:
    """Mutable, owned by the event loop: health, discovered models, the gateway's own load."""

    config: ReplicaConfig
    stale_after_s: float = 1.0
    gpu_stale_s: float = 10.0
    healthy: bool = False
    in_flight: int = 0
    # Other gateway processes' requests in flight here (shared state's pushes and leases; 0 alone).
    remote_in_flight: int = 0
    # Requests vLLM's /load counts beyond every gateway process's own (other clients), as
    # two consecutive reads agree (load_probe.py); 0 while not probed.
    foreign_in_flight: int = 0
    load_probes_total: int = 0
    # Model cards from the replica's /v1/models (base model and LoRA adapters).
    model_cards: tuple[dict[str, Any], ...] = ()
    models: frozenset[str] = frozenset()
    consecutive_failures: int = 0
    # Health checks hold it down (their unhealthy threshold met, the healthy one not since);
    # `healthy` is whether it is routable: up by health checks and not ejected (pool.py).
    probe_down: bool = False
    passive_failures: int = 0
    # Drained by an operator (admin API, discovery removal): routed nothing new, streams finish.
    drained: bool = False
    last_error: str = ""
    requests_total: int = 0
    errors_total: int = 0
    # Score loop: the last good scrape, and the gateway's own in-flight count at that moment.
    metrics: VllmMetrics | None = None
    scraped_at: float = 0.0
    in_flight_at_scrape: int = 0
    scrape_errors: int = 0
    # Cadence (score_loop.py): attempts sent, and the seconds from the last good scrape to the
    # next one planned (0: no plan, freshness counts the plain age).
    scrapes_total: int = 0
    scrape_interval_s: float = 0.0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p99_s: float | None = None
    error_rate: float | None = None
    loaded_adapters: frozenset[str] = frozenset()
    # Prompt tokens the gateway sent here that have not produced a first byte yet.
    queued_prefill_tokens: int = 0
    # Blocks the tier-2 prefix index holds for this replica (updated when it is routed to
    # and on each of its KV-event batches).
    cached_blocks: int = 0
    # Worker heartbeat or NVML.
    gpu_mem_used_frac: float | None = None
    gpu_util: float | None = None
    gpu_seen_at: float = 0.0
    # The replica's liveness as its agent last saw it (an agent without a GPU reader).
    agent_vllm_healthy: bool | None = None
    agent_seen_at: float = 0.0
    # Deadlines of attempts waiting for this replica's answer (cut short when it goes down).
    awaiting: set[asyncio.Timeout] = field(default_factory=set, repr=False, compare=False)
    # The last snapshot and what it was built from: most replicas are unchanged between two
    # requests, and building one costs ~3 µs (16 replicas: most of a routing decision).
    _snap: ReplicaSnapshot | None = field(default=None, init=False, repr=False, compare=False)
    _snap_key: tuple[object, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.config.models:
            self.models = frozenset(self.config.models)

    @property
    def name(self) -> str:
        return self.config.name

    def freshness(self, now: float) -> float:
        """1 until the planned scrape is `stale_after_s` late, falling linearly to 0 after."""
        if self.metrics is None:
            return 0.0
        # Lateness, not age: the loop scrapes less often while the gateway's own accounting
        # explains the replica, and those values are as good as new; only a scrape that was
        # due and has not come (the replica fails, or stalls) costs trust.
        late = now - self.scraped_at - self.scrape_interval_s
        stale = self.stale_after_s
        if late <= stale:
            return 1.0
        return max(0.0, 1.0 - (late - stale) / (_STALE_SPAN * stale))

    def freshness_now(self) -> float:
        """Freshness at this instant, with the configured staleness bound (tests, metrics)."""
        return self.freshness(time.monotonic())

    def snapshot(self, now: float, admitted: bool = True) -> ReplicaSnapshot:
        """What the router sees; `admitted` False: a returning replica sits this one out."""
        fresh = self.freshness(now)
        gpu_ok = now - self.gpu_seen_at <= self.gpu_stale_s
        key = (
            self.in_flight,
            self.remote_in_flight,
            self.foreign_in_flight,
            self.healthy and not self.drained,
            self.queued_prefill_tokens,
            self.cached_blocks,
            self.metrics,
            fresh,
            gpu_ok,
            self.gpu_seen_at,
            self.models,
            self.loaded_adapters,
            admitted,
        )
        if self._snap is not None and key == self._snap_key:
            return self._snap
        snap = self._build_snapshot(fresh, gpu_ok, admitted)
        self._snap, self._snap_key = snap, key
        return snap

    def _build_snapshot(self, fresh: float, gpu_ok: bool, admitted: bool) -> ReplicaSnapshot:
        m = self.metrics
        running = waiting = kv = None
        capacity = None
        if m is not None:
            capacity = (
                m.block_size * m.num_gpu_blocks if m.block_size and m.num_gpu_blocks else None
            )
        if m is not None and fresh > 0.0:
            running, waiting, kv = m.running, m.waiting, m.kv_usage
            # Bursts between scrapes: what the gateway itself sent since counts at once. New
            # arrivals queue in vLLM until its next step; departures free running slots.
            delta = self.in_flight - self.in_flight_at_scrape
            if delta > 0 and waiting is not None:
                waiting += delta
            elif delta < 0 and running is not None:
                running = max(0.0, running + delta)
        return ReplicaSnapshot(
            name=self.config.name,
            url=self.config.url,
            models=self.models,
            weight=self.config.weight,
            labels=self.config.labels,
            healthy=self.healthy and not self.drained,
            # The router balances every process's load, and other clients' as /load tells it;
            # the scrape deltas above stay this process's own (the others' arrivals reach
            # vLLM's counts by the next scrape).
            in_flight=self.in_flight + self.remote_in_flight + self.foreign_in_flight,
            running=running,
            waiting=waiting,
            kv_usage=kv,
            cache_capacity_tokens=capacity,
            ttft_p50_s=self.ttft_p50_s if fresh else None,
            ttft_p99_s=self.ttft_p99_s if fresh else None,
            itl_p99_s=self.itl_p99_s if fresh else None,
            error_rate=self.error_rate if fresh else None,
            gpu_mem_used_frac=self.gpu_mem_used_frac if gpu_ok else None,
            gpu_util=self.gpu_util if gpu_ok else None,
            freshness=fresh,
            loaded_adapters=self.loaded_adapters,
            queued_prefill_tokens=self.queued_prefill_tokens,
            cached_blocks=self.cached_blocks,
            admitted=admitted,
        )
