"""Scorer: the seed document's long-tail suppression by P99 tier (000 §3.1).

    green  p99 < green_s            -> 1.0
    yellow green_s <= p99 <= red_s  -> 0.4 + 0.6 * (red_s - p99) / (red_s - green_s)
    red    p99 > red_s              -> red_score
With this scorer weighted above the others, max_score sends new requests away from a red
replica whenever a green or yellow one exists (yellow never drops below 0.4), which is the
document's redirect. A replica with no P99 yet gets the neutral score (routing.scoring.settle).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.scoring import settle
from routing.types import ReplicaSnapshot, RequestFeatures

_LATENCIES = ("ttft_p99_s", "itl_p99_s")


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the latency_tier scorer."""

    latency: str = param("ttft_p99_s", "P99 to read: ttft_p99_s or itl_p99_s")
    green_s: float = param(0.08, "P99 in seconds below which a replica is green (score 1)")
    red_s: float = param(0.2, "P99 in seconds above which a replica is red")
    red_score: float = param(0.1, "score of a red replica")

    def __post_init__(self) -> None:
        if self.latency not in _LATENCIES:
            raise ValueError(
                f"latency must be one of {', '.join(_LATENCIES)}, got {self.latency!r}"
            )
        if not 0 <= self.green_s < self.red_s:
            raise ValueError("need 0 <= green_s < red_s")


class LatencyTier:
    """Scores replicas by P99 latency tier."""

    __slots__ = ("_itl", "_p")

    def __init__(self, params: Params) -> None:
        self._p = params
        self._itl = params.latency == "itl_p99_s"

    def tier(self, p99: float | None) -> float | None:
        """The tier score of one P99 in seconds (None stays None)."""
        p = self._p
        if p99 is None:
            return None
        if p99 < p.green_s:
            return 1.0
        if p99 <= p.red_s:
            return 0.4 + 0.6 * (p.red_s - p99) / (p.red_s - p.green_s)
        return p.red_score

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        itl = self._itl
        return settle([self.tier(r.itl_p99_s if itl else r.ttft_p99_s) for r in replicas], replicas)


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, LatencyTier)
