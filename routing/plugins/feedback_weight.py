"""Scorer: the seed document's feedback weights from latency and errors (000 §2.2).

    latency < fast_s and error < low_error    -> good  (the document: P95 < 0.2 s, < 0.5%: 1.0)
    latency <= slow_s and error < high_error  -> fair  (0.2-0.8 s, < 2%: 0.75)
    otherwise                                 -> poor  (> 0.8 s or > 2%: 0.2)
Latency is ttft_p99_s (snapshots carry no P95, so this is the stricter reading); the sliding
window (5 min in the document) is the window the gateway computes its percentiles and error
rate over. A replica is judged on what is known: a missing latency or error rate passes that
condition; if both are unknown it gets the neutral score (routing.scoring.settle).
The parameters default to the document's figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.scoring import settle
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the feedback_weight scorer."""

    fast_s: float = param(0.2, "latency below this (and few errors) is the good tier")
    slow_s: float = param(0.8, "latency above this is the poor tier")
    low_error: float = param(0.005, "error rate below this (and fast) is the good tier")
    high_error: float = param(0.02, "error rate at or above this is the poor tier")
    good: float = param(1.0, "score of the good tier")
    fair: float = param(0.75, "score of the fair tier")
    poor: float = param(0.2, "score of the poor tier")

    def __post_init__(self) -> None:
        if not (0 <= self.fast_s <= self.slow_s and 0 <= self.low_error <= self.high_error):
            raise ValueError("need 0 <= fast_s <= slow_s and 0 <= low_error <= high_error")


class FeedbackWeight:
    """Scores replicas by latency and error-rate tier."""

    __slots__ = ("_p",)

    def __init__(self, params: Params) -> None:
        self._p = params

    def tier(self, r: ReplicaSnapshot) -> float | None:
        """The tier score, or None when neither input is known."""
        p = self._p
        lat, err = r.ttft_p99_s, r.error_rate
        if lat is None and err is None:
            return None
        lat_v = 0.0 if lat is None else lat
        err_v = 0.0 if err is None else err
        if lat_v < p.fast_s and err_v < p.low_error:
            return p.good
        if lat_v <= p.slow_s and err_v < p.high_error:
            return p.fair
        return p.poor

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        return settle([self.tier(r) for r in replicas], replicas)


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, FeedbackWeight)
