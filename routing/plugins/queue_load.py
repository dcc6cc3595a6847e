"""Scorer: prefer replicas with fewer requests waiting to be scheduled.

queue = max(waiting, in_flight - running): vLLM's num_requests_waiting, or this gateway's
requests beyond those the replica reports running, whichever is larger. The second term
sees a burst the last scrape has not (requests sent since are queued or about to be);
taking the max, not the sum, avoids counting twice the requests both already show.
With running unknown the queue is `waiting`; with waiting unknown it is the in-flight
excess; with both unknown the replica gets the neutral score (routing.scoring.settle).
Normalised over the candidates (routing.scoring.relative): the shortest queue scores 1,
each extra queued request costs 1 / (spread + 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory
from routing.scoring import NEUTRAL, relative, settle
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """The queue_load scorer has no parameters."""


def queue(r: ReplicaSnapshot) -> float | None:
    """Requests queued on the replica, or None when neither running nor waiting is known."""
    if r.running is None:
        return r.waiting
    excess = max(0.0, r.in_flight - r.running)
    return excess if r.waiting is None else max(r.waiting, excess)


class QueueLoad:
    """Scores queue length relative to the shortest queue among the candidates."""

    __slots__ = ()

    def __init__(self, params: Params) -> None:
        del params

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        queues = [queue(r) for r in replicas]
        known = [q for q in queues if q is not None]
        if not known:
            return [NEUTRAL] * len(replicas)
        rel = iter(relative(known))
        return settle([None if q is None else next(rel) for q in queues], replicas)


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, QueueLoad)
