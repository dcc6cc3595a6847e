"""Filter: drop replicas at or over a load limit, so no request is sent to a full replica.

A replica is kept only while it is below every configured limit (None = no limit); an
unknown scraped value (never scraped, or stale beyond trust) does not count against it.
If every candidate is saturated the router raises Saturated, which the gateway turns
into "queue the request" (the tier-3 admission queue) rather than overloading a replica.
The limits are on vllm:num_requests_running (max_running), vllm:num_requests_waiting
(max_waiting), vllm:kv_cache_usage_perc, 0..1 (max_kv_usage), and this gateway's own
in-flight requests (max_in_flight).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar

from routing.plugin import PluginFactory, param
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the saturation filter."""

    max_running: float | None = param(None, "running-request limit (None: no limit)")
    max_waiting: float | None = param(16.0, "waiting-request limit (None: no limit)")
    max_kv_usage: float | None = param(0.95, "KV-cache usage limit, 0..1 (None: no limit)")
    max_in_flight: int | None = param(None, "gateway in-flight limit (None: no limit)")

    def __post_init__(self) -> None:
        for name in ("max_running", "max_waiting", "max_kv_usage", "max_in_flight"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 or None, got {value}")


# Each limit's snapshot field, in the order they are checked.
_FIELDS = (
    ("max_in_flight", "in_flight"),
    ("max_waiting", "waiting"),
    ("max_kv_usage", "kv_usage"),
    ("max_running", "running"),
)


class Saturation:
    """Keeps replicas below every configured limit."""

    __slots__ = ("_limits",)
    # Full replicas free up as requests finish: an empty result means wait, not fail.
    saturating: ClassVar[bool] = True

    def __init__(self, params: Params) -> None:
        # Only the configured limits are checked: this runs for every candidate of every request.
        self._limits: tuple[tuple[Callable[[ReplicaSnapshot], float | None], float], ...] = tuple(
            (attrgetter(field), float(limit))
            for name, field in _FIELDS
            if (limit := getattr(params, name)) is not None
        )

    def saturated(self, r: ReplicaSnapshot) -> bool:
        """Whether the replica is at or over any limit (an unknown value is under it)."""
        for get, limit in self._limits:
            value = get(r)
            # `not <`, not `>=`: a NaN is at its limit, as it is in `filter`.
            if value is not None and not value < limit:
                return True
        return False

    def filter(
        self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]
    ) -> Sequence[ReplicaSnapshot]:
        limits = self._limits
        if not limits:
            return replicas
        if len(limits) == 1:
            # The default profile's case: one limit, checked inline.
            ((get, limit),) = limits
            kept = [r for r in replicas if (v := get(r)) is None or v < limit]
        else:
            kept = [r for r in replicas if not self.saturated(r)]
        return replicas if len(kept) == len(replicas) else kept


FACTORY = PluginFactory(__name__, __doc__, "filter", Params, Saturation)
