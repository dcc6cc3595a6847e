"""The replay's contenders by name: `direct` (the client places), our gateway, the peers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks.replay.workloads import Item
from benchmarks.routing_bench.contenders import Contender, FleetInfo
from benchmarks.routing_bench.gateway_contender import BUILTIN_MODES, GatewayContender, GatewayMode

DIRECT = "direct"
DEFAULT = "gateway:default"


@dataclass
class Direct:
    """No router: each request goes straight to replica place mod N (the ceiling's placement)."""

    name: str = DIRECT
    headers: dict[str, str] = field(default_factory=dict)
    _urls: tuple[str, ...] = ()

    async def start(self, fleet: FleetInfo) -> str:
        self._urls = fleet.urls
        return ""

    async def stop(self) -> None:
        self._urls = ()

    def pids(self) -> list[int]:
        return []

    def url_for(self, item: Item) -> str:
        return self._urls[item.place % len(self._urls)]


def _peer(name: str) -> Contender:
    """A peer by its catalogue name, or PACKAGE:POLICY with any policy the router knows."""
    from benchmarks.routing_bench.peers import CATALOGUE, PACKAGES, PeerContender

    prefix, _, policy = name.partition(":")
    exact = [c for c in CATALOGUE if c[0] == name]
    same = [c for c in CATALOGUE if prefix in (c[1], c[0].split(":")[0])]
    if not (exact or (same and policy)):
        known = ", ".join(c[0] for c in CATALOGUE)
        raise ValueError(f"unknown contender {name!r} (peers: {known}, or PACKAGE:POLICY)")
    cname, pkg, pol, launch, timeout, headers = exact[0] if exact else same[0]
    if not exact:
        cname, pol = f"{cname.split(':')[0]}:{policy}", policy
    return PeerContender(cname, PACKAGES[pkg], pol, launch, timeout, headers=headers)


def resolve(names: Sequence[str], variants: Sequence[GatewayMode] = ()) -> list[Contender]:
    """The named contenders in order, then every variant not named; unknown names raise."""
    modes = {m.label: m for m in (*BUILTIN_MODES, *variants)}
    out: list[Contender] = []
    for name in names:
        if name == DIRECT:
            out.append(Direct())
        elif name.startswith("gateway:"):
            label = name.split(":", 1)[1]
            if label not in modes:
                raise ValueError(f"unknown contender {name!r} (gateway: {', '.join(modes)})")
            out.append(GatewayContender(modes[label]))
        else:
            out.append(_peer(name))
    taken = {c.name for c in out}
    out += [GatewayContender(m) for m in variants if f"gateway:{m.label}" not in taken]
    seen: set[str] = set()
    for c in out:
        if c.name in seen:
            raise ValueError(f"contender {c.name} named twice")
        seen.add(c.name)
    return out
