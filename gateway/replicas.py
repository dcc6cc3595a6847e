"""Live state of each replica as the gateway sees it, and exact in-flight accounting."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.config import ReplicaConfig
from gateway.vllm_metrics import VllmMetrics
from routing.types import ReplicaSnapshot

# Scraped values older than `stale_after` lose trust linearly and reach none at this multiple.
_STALE_SPAN = 4.0


@dataclass(slots=True)
class ReplicaState:
    """Mutable, owned by the event loop: health, discovered models, the gateway's own load."""

    config: ReplicaConfig
    stale_after_s: float = 1.0
    gpu_stale_s: float = 10.0
    healthy: bool = False
    in_flight: int = 0
    # Model cards from the replica's /v1/models (base model and LoRA adapters).
    model_cards: tuple[dict[str, Any], ...] = ()
    models: frozenset[str] = frozenset()
    consecutive_failures: int = 0
    passive_failures: int = 0
    last_error: str = ""
    requests_total: int = 0
    errors_total: int = 0
    # Score loop: the last good scrape, and the gateway's own in-flight count at that moment.
    metrics: VllmMetrics | None = None
    scraped_at: float = 0.0
    in_flight_at_scrape: int = 0
    scrape_errors: int = 0
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
        """1 for a recent scrape, falling linearly to 0; 0 when never scraped."""
        if self.metrics is None:
            return 0.0
        age = now - self.scraped_at
        stale = self.stale_after_s
        if age <= stale:
            return 1.0
        return max(0.0, 1.0 - (age - stale) / (_STALE_SPAN * stale))

    def freshness_now(self) -> float:
        """Freshness at this instant, with the configured staleness bound (tests, metrics)."""
        return self.freshness(time.monotonic())

    def snapshot(self, now: float) -> ReplicaSnapshot:
        fresh = self.freshness(now)
        gpu_ok = now - self.gpu_seen_at <= self.gpu_stale_s
        key = (
            self.in_flight,
            self.healthy,
            self.queued_prefill_tokens,
            self.cached_blocks,
            self.metrics,
            fresh,
            gpu_ok,
            self.gpu_seen_at,
            self.models,
            self.loaded_adapters,
        )
        if self._snap is not None and key == self._snap_key:
            return self._snap
        snap = self._build_snapshot(fresh, gpu_ok)
        self._snap, self._snap_key = snap, key
        return snap

    def _build_snapshot(self, fresh: float, gpu_ok: bool) -> ReplicaSnapshot:
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
            healthy=self.healthy,
            in_flight=self.in_flight,
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
        )


@dataclass(slots=True)
class Lease:
    """One request's claim on a replica: released exactly once, whatever path ends it."""

    replica: ReplicaState
    released: bool = False

    def release(self, ok: bool, passive_failure_threshold: int) -> None:
        if self.released:
            return
        self.released = True
        r = self.replica
        r.in_flight -= 1
        r.requests_total += 1
        if ok:
            r.passive_failures = 0
            return
        r.errors_total += 1
        r.passive_failures += 1
        # Live traffic sees a dead replica before the next active probe does.
        if r.passive_failures >= passive_failure_threshold:
            r.healthy = False


@dataclass(slots=True)
class ReplicaPool:
    """Every configured replica, by name, in configuration order."""

    replicas: dict[str, ReplicaState] = field(default_factory=dict)

    @classmethod
    def from_configs(
        cls,
        configs: tuple[ReplicaConfig, ...],
        stale_after_s: float = 1.0,
        gpu_stale_s: float = 10.0,
    ) -> ReplicaPool:
        return cls({c.name: ReplicaState(c, stale_after_s, gpu_stale_s) for c in configs})

    def __iter__(self) -> Iterator[ReplicaState]:
        return iter(self.replicas.values())

    def __getitem__(self, name: str) -> ReplicaState:
        return self.replicas[name]

    def snapshots(self) -> list[ReplicaSnapshot]:
        now = time.monotonic()
        return [r.snapshot(now) for r in self.replicas.values()]

    def acquire(self, name: str) -> Lease:
        replica = self.replicas[name]
        replica.in_flight += 1
        return Lease(replica)

    def known_models(self) -> frozenset[str]:
        """Every model any replica serves or has served, healthy or not."""
        out: set[str] = set()
        for r in self.replicas.values():
            out |= r.models
        return frozenset(out)

    def is_lora(self, model: str) -> bool:
        """True when a replica lists `model` with a parent (a LoRA adapter)."""
        for r in self.replicas.values():
            for card in r.model_cards:
                if card.get("id") == model:
                    return card.get("parent") is not None
        return False

    def ready(self) -> bool:
        return any(r.healthy for r in self.replicas.values())

    def model_cards(self) -> list[dict[str, Any]]:
        """The union of what healthy replicas serve, each model once."""
        seen: dict[str, dict[str, Any]] = {}
        for r in self.replicas.values():
            if not r.healthy:
                continue
            for card in r.model_cards:
                seen.setdefault(str(card.get("id")), card)
        return list(seen.values())

    def live_rows(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [
            {
                "name": r.name,
                "in_flight": r.in_flight,
                "healthy": r.healthy,
                "metrics_age_s": now - r.scraped_at if r.metrics is not None else None,
                "freshness": r.freshness(now),
                "gpu_mem_used_frac": r.gpu_mem_used_frac,
                "gpu_util": r.gpu_util,
            }
            for r in self.replicas.values()
        ]
