"""Model versions: which version of a public model a request gets (canary / A-B weights).

A public model name maps to versions, each with a weight (0-100, summing to 100) and a stage:
exactly one `stable` version (the baseline) and any number of canaries (`initial`: just
introduced, `progressive`: ramping up). A request is placed on the weight line [0, 100):

- with a session key (x-session-id or the body's `user`) at a point hashed from the model and
  the key, so a conversation stays on one version for as long as the weights stay;
- without one at a point drawn from the caller's seeded generator.

A per-request override (`X-Canary-Weight: w`, when the gateway allows it) redraws the line:
the canaries share `w` percent in proportion to their configured weights (equally when those
are all 0) and the stable version gets the rest; a session keeps its point on the new line.
Pure and synchronous: the gateway's stage (gateway/proxy/versions.py) calls `choose`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import xxhash

Stage = Literal["initial", "progressive", "stable"]
STAGES: tuple[Stage, ...] = ("initial", "progressive", "stable")
_SPAN = 100.0
_HASH_SPAN = float(2**64)


@dataclass(frozen=True, slots=True)
class Version:
    """One version of a public model: its share, stage and where it is served."""

    name: str
    weight: int
    stage: Stage = "stable"
    # Replicas serving this version carry every one of these labels (empty: any replica).
    labels: Mapping[str, str] = field(default_factory=dict)
    # The model name the replicas serve this version under ("": the public name itself).
    served_model: str = ""


@dataclass(frozen=True, slots=True)
class VersionSet:
    """A public model's versions; the constructor checks weights, stages and names."""

    model: str
    versions: tuple[Version, ...]

    def __post_init__(self) -> None:
        where = f"model {self.model!r}"
        if not self.versions:
            raise ValueError(f"{where}: at least one version")
        names = [v.name for v in self.versions]
        if len(set(names)) != len(names) or not all(names):
            raise ValueError(f"{where}: version names must be unique and non-empty")
        for v in self.versions:
            if not 0 <= v.weight <= 100:
                raise ValueError(f"{where}: version {v.name!r} weight must be 0..100")
            if v.stage not in STAGES:
                raise ValueError(f"{where}: version {v.name!r} stage must be one of {STAGES}")
        if sum(v.weight for v in self.versions) != 100:
            raise ValueError(f"{where}: version weights must sum to 100")
        stable = [v for v in self.versions if v.stage == "stable"]
        if len(stable) != 1:
            raise ValueError(f"{where}: exactly one version must be stable, got {len(stable)}")

    @property
    def stable(self) -> Version:
        """The baseline version (the one an override of 0 sends everything to)."""
        return next(v for v in self.versions if v.stage == "stable")


def weights(versions: VersionSet, canary_weight: int | None = None) -> tuple[float, ...]:
    """Each version's share of the line, configured or with the canaries at `canary_weight`."""
    configured = tuple(float(v.weight) for v in versions.versions)
    if canary_weight is None:
        return configured
    if not 0 <= canary_weight <= 100:
        raise ValueError(f"canary weight must be 0..100, got {canary_weight}")
    canary_total = sum(w for v, w in zip(versions.versions, configured, strict=True)
                       if v.stage != "stable")  # fmt: skip
    canaries = sum(1 for v in versions.versions if v.stage != "stable")
    out: list[float] = []
    for v, w in zip(versions.versions, configured, strict=True):
        if v.stage == "stable":
            out.append(float(100 - canary_weight) if canaries else 100.0)
        elif canary_total > 0:
            out.append(canary_weight * w / canary_total)
        else:
            out.append(canary_weight / canaries)
    return tuple(out)


def point(model: str, session: str | None, rng: random.Random) -> float:
    """Where on [0, 100) a request falls: hashed from its session, else drawn."""
    if session is None:
        return rng.random() * _SPAN
    digest = xxhash.xxh3_64_intdigest(f"{model}\0{session}".encode("utf-8", "surrogatepass"))
    return digest / _HASH_SPAN * _SPAN


def on_line(shares: Sequence[float], at: float) -> int:
    """The index of the share that covers `at` (shares laid end to end from 0)."""
    edge = 0.0
    last = 0
    for i, share in enumerate(shares):
        if share <= 0.0:
            continue
        edge += share
        last = i
        if at < edge:
            return i
    return last  # rounding at the top end: the last version with a share


def choose(
    versions: VersionSet,
    session: str | None,
    rng: random.Random,
    canary_weight: int | None = None,
) -> Version:
    """The version this request gets (see the module doc)."""
    shares = weights(versions, canary_weight)
    return versions.versions[on_line(shares, point(versions.model, session, rng))]
