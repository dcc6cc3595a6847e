"""Every replica by name, and the lease that keeps in-flight counts exact on every path."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.config import ReplicaConfig
from gateway.replicas.state import ReplicaState
from routing.types import ReplicaSnapshot


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
                "scrapes_total": r.scrapes_total,
                "scrape_interval_s": r.scrape_interval_s,
                "gpu_mem_used_frac": r.gpu_mem_used_frac,
                "gpu_util": r.gpu_util,
            }
            for r in self.replicas.values()
        ]
