"""The replay's contenders by name: `direct` (the client places), our gateway, `placed:`, peers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from benchmarks.replay.workloads import Item
from benchmarks.routing_bench.contenders import Contender, FleetInfo
from benchmarks.routing_bench.gateway_contender import BUILTIN_MODES, GatewayContender, GatewayMode

DIRECT = "direct"
DEFAULT = "gateway:default"
# `placed:LABEL`: each request sent straight to the replica `gateway:LABEL` chose for it.
PLACED = "placed:"


class PlacementMissing(ValueError):
    """A `placed:` contender has no placement for some request of its round."""


@dataclass
class _ClientPlaced(ABC):
    """No router: the client sends each request straight to the replica `replica_for` names."""

    name: str
    headers: dict[str, str] = field(default_factory=dict)
    _urls: tuple[str, ...] = ()

    async def start(self, fleet: FleetInfo) -> str:
        self._urls = fleet.urls
        return ""

    async def stop(self) -> None:
        self._urls = ()

    def pids(self) -> list[int]:
        return []

    @abstractmethod
    def replica_for(self, item: Item) -> int:
        """The index of the replica `item` goes to."""

    def url_for(self, item: Item) -> str:
        return self._urls[self.replica_for(item)]


@dataclass
class Direct(_ClientPlaced):
    """Each request to replica place mod N (the ceiling's placement)."""

    name: str = DIRECT

    def replica_for(self, item: Item) -> int:
        return item.place % len(self._urls)


@dataclass
class Placed(_ClientPlaced):
    """The gateway's placement: each request straight to the replica `gateway:LABEL` chose for
    it earlier in the same round (so the two differ by the relay and the observation alone,
    placement held fixed)."""

    _where: dict[str, int] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """The gateway contender whose placement this one replays."""
        return "gateway:" + self.name.removeprefix(PLACED)

    def use(self, placement: Mapping[str, int], items: Sequence[Item]) -> None:
        """Take `placement` (request id -> replica index) for the round of `items`."""
        missing = [it.req.rid for it in items if it.req.rid not in placement]
        if missing:
            raise PlacementMissing(
                f"{self.source} placed {len(items) - len(missing)} of {len(items)} requests "
                f"(none for {missing[0]})"
            )
        self._where = dict(placement)

    def replica_for(self, item: Item) -> int:
        return self._where[item.req.rid]


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
    # Every gateway logs where each request went: the rows' co-location and `placed:` need it.
    modes = {m.label: replace(m, request_log=True) for m in (*BUILTIN_MODES, *variants)}
    out: list[Contender] = []
    for name in names:
        if name == DIRECT:
            out.append(Direct())
        elif name.startswith("gateway:"):
            label = name.split(":", 1)[1]
            if label not in modes:
                raise ValueError(f"unknown contender {name!r} (gateway: {', '.join(modes)})")
            out.append(GatewayContender(modes[label]))
        elif name.startswith(PLACED):
            placed = Placed(name)
            if placed.source not in {c.name for c in out}:
                raise ValueError(f"{name} must come after {placed.source} in the contenders")
            out.append(placed)
        else:
            out.append(_peer(name))
    taken = {c.name for c in out}
    out += [GatewayContender(modes[m.label]) for m in variants if f"gateway:{m.label}" not in taken]
    seen: set[str] = set()
    for c in out:
        if c.name in seen:
            raise ValueError(f"contender {c.name} named twice")
        seen.add(c.name)
    return out
