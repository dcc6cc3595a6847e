"""Live fleet changes: add, drain, undrain and remove replicas, the one path every caller takes.

The admin API, a configuration reload and DNS discovery all change the fleet here, one change
at a time. A removal drains first (no new requests; streams run to their end), waits for the
replica's in-flight count to reach 0 within `[server] drain_timeout_s`, and only then stops its
loops and forgets what it cached. A removal that would leave no routable replica is refused
unless forced; one whose streams outlast the wait keeps the replica drained, unless forced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.config import ReplicaConfig
from gateway.config_loader import load_dataclass
from gateway.replicas.state import ReplicaState

if TYPE_CHECKING:
    from gateway.admin.changes import Change
    from gateway.runtime import Runtime

log = logging.getLogger("llm_gateway.admin")

# How often a removal looks at the draining replica's in-flight count.
_POLL_S = 0.02


class FleetError(Exception):
    """A fleet change refused: its HTTP status and a message naming the cause."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Removal:
    """What a removal did: removed or kept drained, after how long, with what still open."""

    name: str
    removed: bool
    waited_s: float
    # Requests still in flight when it was removed (forced) or when the wait ran out.
    in_flight: int
    outcome: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "removed": self.removed,
            "waited_s": round(self.waited_s, 3),
            "in_flight": self.in_flight,
            "outcome": self.outcome,
        }


def parse_replica(data: Mapping[str, Any]) -> ReplicaConfig:
    """A replica from JSON, validated exactly as a [[replicas]] table (ConfigError names keys)."""
    return load_dataclass(ReplicaConfig, data, "replica")


class Fleet:
    """The runtime's replicas as operators change them; remembers where each one came from."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._lock = asyncio.Lock()
        # One reload at a time (gateway/admin/reload.py); fleet changes take `_lock` each.
        self.reload_lock = asyncio.Lock()
        # "config" ([[replicas]]: a reload owns them), "admin" (the API) or, from discovery,
        # "dns" or "kubernetes".
        self.origins: dict[str, str] = {r.name: "config" for r in runtime.pool}
        # Under --workers: hands an admin change applied here to every sibling, and says how
        # each took it ({"0": "ok", "1": "error: ..."}). None in a single process.
        self.spread: Callable[[Change], Awaitable[dict[str, str]]] | None = None

    def start_discovery(self, tg: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """The discovery loop of [discovery], in the runtime's task group (none when static)."""
        cfg = self._runtime.config.discovery
        from gateway.admin.discovery import discovery_for

        discovery = discovery_for(cfg, self)
        return [] if discovery is None else [tg.create_task(discovery.run())]

    def get(self, name: str) -> ReplicaState:
        replica = self._runtime.pool.replicas.get(name)
        if replica is None:
            raise FleetError(f"no replica named {name!r}", 404)
        return replica

    async def add(self, cfg: ReplicaConfig, origin: str) -> ReplicaState:
        """Add `cfg` live (409 on a name or url already served); it slow-starts if configured."""
        runtime = self._runtime
        async with self._lock:
            for r in runtime.pool:
                if r.name == cfg.name:
                    raise FleetError(f"replica {cfg.name!r} already exists", 409)
                if r.config.url == cfg.url:
                    raise FleetError(f"url {cfg.url} is already served by replica {r.name!r}", 409)
            slow = runtime.config.discovery.slow_start
            replica = await runtime.add_replica(cfg, slow)
            self.origins[cfg.name] = origin
        log.info(
            "replica %s added (%s): %s, %s%s",
            cfg.name,
            origin,
            cfg.url,
            "up" if replica.healthy else "not up yet",
            ", slow start" if slow else "",
        )
        return replica

    def drain(self, name: str, why: str = "admin") -> bool:
        """Route nothing new to `name`; its streams run on. False when it was drained already."""
        replica = self.get(name)
        if replica.drained:
            return False
        replica.drained = True
        log.info("replica %s drained (%s): %d in flight", name, why, replica.in_flight)
        return True

    def undrain(self, name: str, why: str = "admin") -> bool:
        """Route to `name` again. False when it was not drained."""
        replica = self.get(name)
        if not replica.drained:
            return False
        replica.drained = False
        log.info("replica %s undrained (%s)", name, why)
        admission = self._runtime.admission
        if admission is not None:
            admission.notify()  # waiting requests may fit there now
        return True

    def _others_routable(self, name: str) -> int:
        return sum(1 for r in self._runtime.pool if r.name != name and r.healthy and not r.drained)

    async def remove(
        self, name: str, force: bool = False, wait_s: float | None = None, why: str = "admin"
    ) -> Removal:
        """Drain, wait for in-flight 0 (at most `wait_s`, default drain_timeout_s), remove."""
        runtime = self._runtime
        async with self._lock:
            replica = self.get(name)
            routable = replica.healthy and not replica.drained
            if routable and not force and self._others_routable(name) == 0:
                raise FleetError(
                    f"replica {name!r} is the last routable one; force=true removes it anyway",
                    409,
                )
            if not replica.drained:
                replica.drained = True
                log.info("replica %s drained for removal (%s)", name, why)
        limit = runtime.config.server.drain_timeout_s if wait_s is None else wait_s
        started = time.monotonic()
        deadline = started + limit
        # Drained first, so no decision made from here on picks it; one made just before may
        # still be acquiring its lease: the loop below sees it in in_flight.
        await asyncio.sleep(0)
        # Polled: the count changes in Lease.release, on the hot path, which gets no hook.
        while replica.in_flight > 0 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(_POLL_S)
        waited = time.monotonic() - started
        left = replica.in_flight
        if left and not force:
            log.warning(
                "replica %s: %d requests still in flight after %.1f s; kept drained, not removed",
                name,
                left,
                waited,
            )
            return Removal(name, False, waited, left, "timed_out_kept_drained")
        async with self._lock:
            if runtime.pool.replicas.get(name) is not replica:
                return Removal(name, False, waited, left, "already_removed")
            await runtime.remove_replica(name)
            self.origins.pop(name, None)
        outcome = "removed_with_streams_open" if left else "removed"
        log.info(
            "replica %s removed (%s) after %.2f s of drain, %d in flight", name, why, waited, left
        )
        return Removal(name, True, waited, left, outcome)
