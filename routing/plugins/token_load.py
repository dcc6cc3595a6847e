"""Scorer: prefer replicas with fewer prompt tokens queued for prefill.

Reads ReplicaSnapshot.queued_prefill_tokens, which the gateway maintains from its own
requests (exact, no scrape lag). Prefill time grows with tokens, not requests, so one
8k-token prompt weighs like many short ones. Normalised over the candidates
(routing.scoring.relative): the lightest scores 1, and every `unit_tokens` above it costs
1 / (spread + unit_tokens) of the score, so differences well below a unit barely count:
unit_tokens is the token difference worth one request of load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.scoring import relative
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the token_load scorer."""

    unit_tokens: float = param(512.0, "queued-token difference that counts as one unit of load")

    def __post_init__(self) -> None:
        if not self.unit_tokens > 0:
            raise ValueError(f"unit_tokens must be > 0, got {self.unit_tokens}")


class TokenLoad:
    """Scores queued prefill tokens relative to the lightest candidate."""

    __slots__ = ("_unit",)

    def __init__(self, params: Params) -> None:
        self._unit = params.unit_tokens

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        return relative([float(r.queued_prefill_tokens) for r in replicas], self._unit)


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, TokenLoad)
