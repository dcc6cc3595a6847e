"""Live state of each replica as the gateway sees it, and exact in-flight accounting."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.config import ReplicaConfig
from routing.types import ReplicaSnapshot


@dataclass(slots=True)
class ReplicaState:
    """Mutable, owned by the event loop: health, discovered models, the gateway's own load."""

    config: ReplicaConfig
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

    def __post_init__(self) -> None:
        if self.config.models:
            self.models = frozenset(self.config.models)

    @property
    def name(self) -> str:
        return self.config.name

    def snapshot(self) -> ReplicaSnapshot:
        return ReplicaSnapshot(
            name=self.config.name,
            url=self.config.url,
            models=self.models,
            weight=self.config.weight,
            labels=self.config.labels,
            healthy=self.healthy,
            in_flight=self.in_flight,
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
    def from_configs(cls, configs: tuple[ReplicaConfig, ...]) -> ReplicaPool:
        return cls({c.name: ReplicaState(c) for c in configs})

    def __iter__(self) -> Iterator[ReplicaState]:
        return iter(self.replicas.values())

    def __getitem__(self, name: str) -> ReplicaState:
        return self.replicas[name]

    def snapshots(self) -> list[ReplicaSnapshot]:
        return [r.snapshot() for r in self.replicas.values()]

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
        return [
            {"name": r.name, "in_flight": r.in_flight, "healthy": r.healthy}
            for r in self.replicas.values()
        ]
