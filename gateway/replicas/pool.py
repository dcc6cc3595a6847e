"""Every replica by name, the lease that keeps in-flight counts exact, and outlier ejection.

The pool applies the outlier policy (outlier.py) to the replicas' state: live outcomes arrive
through leases, probe results through the health checker, and the policy's clock is read here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from gateway.config import ReplicaConfig
from gateway.replicas.model_cards import model_cards
from gateway.replicas.outlier import Ejection, OutlierConfig, OutlierPolicy
from gateway.replicas.state import ReplicaState
from routing.types import ReplicaSnapshot

log = logging.getLogger("llm_gateway.outlier")
health_log = logging.getLogger("llm_gateway.health")


@dataclass(slots=True)
class Lease:
    """One request's claim on a replica: released exactly once, whatever path ends it."""

    replica: ReplicaState
    pool: ReplicaPool
    released: bool = False

    def release(self, ok: bool | None, detail: str = "") -> None:
        """Once: served (True), failed (False; `detail`: its error body's start), or None."""
        if self.released:
            return
        self.released = True
        r = self.replica
        r.in_flight -= 1
        if self.pool.on_in_flight is not None:
            self.pool.on_in_flight()
        r.requests_total += 1
        if ok is None:
            return
        if ok:
            r.passive_failures = 0
            self.pool.outlier.success(r.name, self.pool.clock())
            return
        r.errors_total += 1
        r.passive_failures += 1
        self.pool.passive_failure(r, detail)


@dataclass(slots=True)
class ReplicaPool:
    """Every configured replica, by name, in configuration order."""

    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    # The clock of snapshots and of the outlier policy (tests drive their own).
    clock: Callable[[], float] = time.monotonic
    outlier: OutlierPolicy = field(init=False)
    # Ejections so far, by replica and reason (a counter of the metrics).
    ejections: dict[str, dict[str, int]] = field(init=False)
    # Told of this process's own ejections (shared state passes them to the other processes).
    on_ejection: Callable[[Ejection], None] | None = None
    # Told of each change of this process's in-flight counts (shared state pushes them).
    on_in_flight: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.configure_outlier(OutlierConfig())

    def configure_outlier(self, cfg: OutlierConfig) -> None:
        """A fresh policy over these replicas (before traffic: the records start empty)."""
        self.outlier = OutlierPolicy(cfg, self.replicas)
        self.ejections = {name: {} for name in self.replicas}

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

    def add(self, replica: ReplicaState, slow_start: bool = True) -> None:
        """A replica joins at runtime: routable once a probe passes, ramping if `slow_start`."""
        self.replicas[replica.name] = replica
        self.ejections[replica.name] = {}
        self.outlier.add(replica.name, slow_start)

    def remove(self, name: str) -> ReplicaState:
        """A replica leaves (drained first by the caller): its state and outlier record go."""
        replica = self.replicas.pop(name)
        self.ejections.pop(name, None)
        self.outlier.remove(name)
        return replica

    def __getitem__(self, name: str) -> ReplicaState:
        return self.replicas[name]

    def snapshots(self) -> list[ReplicaSnapshot]:
        now = self.clock()
        outlier = self.outlier
        if now >= outlier.next_event:
            self._tick(now)
        ramping = outlier.ramping
        if not ramping:
            return [r.snapshot(now) for r in self.replicas.values()]
        return self._ramping_snapshots(now, ramping)

    def _ramping_snapshots(self, now: float, ramping: Set[str]) -> list[ReplicaSnapshot]:
        # A ramping replica sits a decision out only where replicas in full service cover all
        # its models: alone (or with only other returning ones) it takes what comes.
        full: set[str] = set()
        for r in self.replicas.values():
            if r.healthy and not r.drained and r.name not in ramping:
                full |= r.models
        outlier = self.outlier
        return [
            r.snapshot(
                now,
                r.name not in ramping or outlier.admitted(r.name) or not r.models <= full,
            )
            for r in self.replicas.values()
        ]

    def acquire(self, name: str) -> Lease:
        replica = self.replicas[name]
        replica.in_flight += 1
        if self.on_in_flight is not None:
            self.on_in_flight()
        if self.outlier.ramping:
            self.outlier.routed(name, self.clock())
        return Lease(replica, self)

    def set_remote_in_flight(self, counts: Mapping[str, int]) -> None:
        """Other gateway processes' in-flight requests per replica (absent: none)."""
        for r in self.replicas.values():
            r.remote_in_flight = counts.get(r.name, 0)

    # --- outlier ejection -----------------------------------------------------------------

    def passive_failure(self, replica: ReplicaState, detail: str) -> None:
        """Live traffic saw `replica` fail: eject it if the policy says so."""
        ejection = self.outlier.failure(replica.name, self.clock(), detail, self._others(replica))
        self._apply(replica, ejection)

    def preempted(self, name: str, count: float) -> None:
        """The score loop saw `count` preemptions on `name` since its last scrape."""
        replica = self.replicas[name]
        self._apply(
            replica, self.outlier.preempted(name, self.clock(), count, self._others(replica))
        )

    def _others(self, replica: ReplicaState) -> int:
        return sum(
            1 for r in self.replicas.values() if r.healthy and not r.drained and r is not replica
        )

    def adopt_ejection(self, ejection: Ejection) -> None:
        """Another gateway process ejected a replica: eject it here too (within the caps)."""
        replica = self.replicas.get(ejection.replica)
        if replica is None:
            return
        mine = self.outlier.adopt(replica.name, self.clock(), ejection, self._others(replica))
        self._apply(replica, mine, "a peer gateway's ")

    def _apply(self, replica: ReplicaState, ejection: Ejection | None, via: str = "") -> None:
        if ejection is None:
            return
        replica.healthy = False
        counts = self.ejections[replica.name]
        counts[ejection.reason] = counts.get(ejection.reason, 0) + 1
        log.warning(
            "replica %s ejected for %.0f s: %s%s (ejection %d)",
            replica.name,
            ejection.duration_s,
            via,
            ejection.reason,
            ejection.count,
        )
        if not via and self.on_ejection is not None:
            self.on_ejection(ejection)

    def probe_passed(self, replica: ReplicaState) -> None:
        """Health checks pass (their threshold met): up, unless a passive ejection holds it."""
        now = self.clock()
        if now >= self.outlier.next_event:
            self._tick(now)
        replica.probe_down = False
        if replica.healthy or self.outlier.ejected(replica.name):
            return
        self._back(replica, now, "is up", health_log)

    def probe_failed(self, replica: ReplicaState, reason: str) -> None:
        """Health checks fail (their threshold met): down, and its waiting attempts cut."""
        if replica.probe_down:
            return
        replica.probe_down = True
        was_up = replica.healthy or self.outlier.ejected(replica.name)
        replica.healthy = False
        self.outlier.down(replica.name)
        if was_up:
            health_log.warning("replica %s is down: %s", replica.name, reason)
        # Attempts still waiting for its answer would wait out their whole deadline on a
        # replica that no longer answers probes: end them now, to be retried elsewhere.
        if replica.awaiting:
            now = asyncio.get_running_loop().time()
            for deadline in replica.awaiting:
                if not deadline.expired():
                    deadline.reschedule(now)

    def _tick(self, now: float) -> None:
        ended, ramped = self.outlier.tick(now)
        for name in ramped:
            log.info("replica %s ramp-up done: back to its full share", name)
        for name in ended:
            replica = self.replicas[name]
            if replica.probe_down:
                log.info("replica %s: ejection over, but it fails health checks", name)
            else:
                self._back(replica, now, "returns after its ejection", log)

    def _back(self, replica: ReplicaState, now: float, what: str, logger: logging.Logger) -> None:
        replica.healthy = True
        replica.passive_failures = 0
        if self.outlier.up(replica.name, now):
            start = 100 * self.outlier.config.ramp_start
            logger.info(
                "replica %s %s: ramping up from %g%% of its share", replica.name, what, start
            )
        else:
            logger.info("replica %s %s", replica.name, what)

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
        return any(r.healthy and not r.drained for r in self.replicas.values())

    def model_cards(self) -> list[dict[str, Any]]:
        """The union of what healthy replicas serve, each model once (see model_cards.py)."""
        return model_cards((r.healthy, r.model_cards) for r in self.replicas.values())

    def live_rows(self) -> list[dict[str, Any]]:
        now = self.clock()
        outlier = self.outlier
        if now >= outlier.next_event:
            self._tick(now)
        return [
            {
                "name": r.name,
                "in_flight": r.in_flight,
                "healthy": r.healthy,
                "metrics_age_s": now - r.scraped_at if r.metrics is not None else None,
                "freshness": r.freshness(now),
                "scrapes_total": r.scrapes_total,
                "scrape_interval_s": r.scrape_interval_s,
                "foreign_in_flight": r.foreign_in_flight,
                "load_probes_total": r.load_probes_total,
                "gpu_mem_used_frac": r.gpu_mem_used_frac,
                "gpu_util": r.gpu_util,
                "kv_usage": r.metrics.kv_usage if r.metrics is not None else None,
                "ejected": outlier.ejected(r.name),
                "admit_fraction": outlier.fraction(r.name, now),
                "ejections": dict(self.ejections[r.name]),
                "drained": r.drained,
            }
            for r in self.replicas.values()
        ]
