"""DNS discovery: re-resolve a name (a headless Kubernetes Service), add and remove replicas.

Each round resolves `hostname` with the system resolver (getaddrinfo runs in a thread, under a
deadline) or, with `nameserver` set, asks that DNS server over UDP (gateway/admin/dns.py),
turns every address into a replica at `scheme://address:port`, and changes the fleet through
the same code as the admin API: new addresses are added (and slow-start), vanished ones
drained and removed once their streams end. A failed lookup changes nothing; a removal whose
streams outlast the drain wait is retried next round, and undone if the address comes back.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

from gateway.admin import dns
from gateway.admin.config import DiscoveryConfig, nameserver_address
from gateway.admin.fleet import Fleet, FleetError
from gateway.config import ReplicaConfig

log = logging.getLogger("llm_gateway.discovery")

# (hostname, port, family) -> addresses; the seam a test may fill with its own lookup.
Resolver = Callable[[str, int, str], Awaitable[list[str]]]
_FAMILY = {"any": socket.AF_UNSPEC, "ipv4": socket.AF_INET, "ipv6": socket.AF_INET6}


async def system_resolve(hostname: str, port: int, family: str) -> list[str]:
    """Every address getaddrinfo gives for `hostname` (/etc/hosts, the cluster's DNS)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(hostname, port, family=_FAMILY[family], type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def nameserver_resolve(cfg: DiscoveryConfig) -> Resolver:
    """A resolver asking `cfg.nameserver` over UDP, each query under resolve_timeout_s."""
    server = nameserver_address(cfg.nameserver)

    async def ask(hostname: str, _port: int, family: str) -> list[str]:
        return await dns.resolve(server, hostname, family, cfg.resolve_timeout_s)

    return ask


class DnsDiscovery:
    """One replica per address of `[discovery] hostname`, kept in step every interval_s."""

    # The fleet origin of the replicas this source added: only those are its to remove.
    origin = "dns"

    def __init__(self, cfg: DiscoveryConfig, fleet: Fleet, resolve: Resolver | None = None) -> None:
        self._cfg = cfg
        self._fleet = fleet
        if resolve is None:
            resolve = nameserver_resolve(cfg) if cfg.nameserver else system_resolve
        self._resolve = resolve
        # Drained by discovery for a removal that has not completed yet.
        self._leaving: set[str] = set()
        self._failing = False

    def replica_config(self, address: str) -> ReplicaConfig:
        cfg = self._cfg
        host = f"[{address}]" if ":" in address else address
        return ReplicaConfig(
            url=f"{cfg.scheme}://{host}:{cfg.port}",
            models=cfg.models,
            labels=dict(cfg.labels),
            kv_events=cfg.kv_events,
        )

    async def lookup(self) -> list[str] | None:
        """The name's addresses now; None when the lookup failed (nothing is changed then)."""
        cfg = self._cfg
        try:
            async with asyncio.timeout(cfg.resolve_timeout_s):
                addresses = await self._resolve(cfg.hostname, cfg.port, cfg.family)
        except (OSError, TimeoutError) as exc:
            if not self._failing:
                log.warning("discovery: cannot resolve %s: %s", cfg.hostname, exc or "timeout")
            self._failing = True
            return None
        if self._failing:
            log.info("discovery: %s resolves again", cfg.hostname)
        self._failing = False
        return addresses

    async def sync_once(self) -> tuple[list[str], list[str]]:
        """One round: (replicas added, replicas removed)."""
        addresses = await self.lookup()
        if addresses is None:
            return [], []
        fleet = self._fleet
        wanted = {c.name: c for c in map(self.replica_config, addresses)}
        mine = {n for n, origin in fleet.origins.items() if origin == self.origin}
        added: list[str] = []
        for name, rcfg in wanted.items():
            if name in mine:
                if name in self._leaving:
                    self._leaving.discard(name)
                    fleet.undrain(name, "discovery: its address is back")
                continue
            try:
                await fleet.add(rcfg, self.origin)
            except FleetError as exc:  # served already (a [[replicas]] table, the API)
                log.debug("discovery: %s not added: %s", name, exc.message)
                continue
            added.append(name)
        removed: list[str] = []
        for name in sorted(mine - set(wanted)):
            self._leaving.add(name)
            try:
                removal = await fleet.remove(name, why="discovery: its address is gone")
            except FleetError as exc:  # the last routable replica: kept until another is up
                log.warning("discovery: %s kept: %s", name, exc.message)
                continue
            if removal.removed:
                self._leaving.discard(name)
                removed.append(name)
        return added, removed

    async def run(self) -> None:
        """Sync now, then every interval_s (cancelled with the runtime's task group)."""
        while True:
            try:
                await self.sync_once()
            except Exception:
                # A bug here must not end the runtime's task group (and the gateway with it).
                log.exception("discovery: round failed")
            await asyncio.sleep(self._cfg.interval_s)


def discovery_for(cfg: DiscoveryConfig, fleet: Fleet) -> DnsDiscovery | None:
    """The discovery loop `[discovery] mode` asks for; None when static."""
    if cfg.mode == "dns":
        return DnsDiscovery(cfg, fleet)
    if cfg.mode == "kubernetes":
        from gateway.admin.kubernetes import KubernetesDiscovery

        return KubernetesDiscovery(cfg, fleet)
    return None
