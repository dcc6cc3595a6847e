"""Values and contracts of the routing pipeline: features and snapshots in, a Decision out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class RoutingError(Exception):
    """Root error of the routing package."""


class NoReplicaError(RoutingError):
    """No replica survived the filters for this request."""

    def __init__(self, model: str, reason: str, filter_name: str | None = None) -> None:
        super().__init__(f"no replica for model {model!r}: {reason}")
        self.model = model
        self.reason = reason
        # The filter that removed the last candidates ("saturation" means: queue, don't fail).
        self.filter_name = filter_name


class PluginConfigError(RoutingError):
    """A profile names an unknown plugin, repeats one, or gives it bad parameters."""


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """What the router may know about one replica at decision time.

    Scraped fields are None when unknown (never scraped, or stale beyond trust).
    """

    name: str
    url: str
    models: frozenset[str]
    weight: float = 1.0
    labels: Mapping[str, str] = field(default_factory=dict)
    healthy: bool = True
    in_flight: int = 0
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    cache_capacity_tokens: int | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p99_s: float | None = None
    error_rate: float | None = None
    gpu_mem_used_frac: float | None = None
    gpu_util: float | None = None
    # 0..1: how much the scraped fields can be trusted (1 fresh, 0 stale).
    freshness: float = 1.0
    # Prompt tokens of this gateway's requests sent to the replica and not yet past prefill
    # (maintained by the gateway, exact like in_flight).
    queued_prefill_tokens: int = 0
    # Blocks the gateway's tier-2 index holds for the replica (KV events, or routing history);
    # None when the gateway keeps no index.
    cached_blocks: int | None = None
    # LoRA adapters currently loaded on the replica (from vLLM's lora_requests_info metric).
    loaded_adapters: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What the router knows about one request (extracted once, on arrival)."""

    model: str
    request_id: str = ""
    prompt_tokens: int = 0
    bucket: str = ""
    max_tokens: int | None = None
    stream: bool = False
    prompt_hash: int | None = None
    block_hashes: tuple[int, ...] = ()
    session: str | None = None
    tenant: str | None = None
    priority: int = 0
    # Per-replica hints computed by the cache index (replica name -> value),
    # e.g. matched prefix blocks; plugins read them, never compute them.
    prefix_match: Mapping[str, int] = field(default_factory=dict)
    # Prompt tokens per block of block_hashes (the replicas' block size, or ~block_chars / 4).
    block_tokens: int = 16
    affinity_replica: str | None = None
    # Why affinity_replica is set: "prompt_cache" (tier-1 prompt hash), "session", or
    # "prefix_home" (no cache holds the prompt; its prefix was last sent there).
    affinity_kind: str | None = None
    # Routing hints from the client (e.g. x-model-hint -> {"arch": "int4"}), matched to labels.
    hints: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Pick:
    """A picker's choice: index into the candidate list and a branch label."""

    index: int
    branch: str


@dataclass(frozen=True, slots=True)
class Decision:
    """The router's answer: where to send the request, why, and every score."""

    replica: ReplicaSnapshot
    branch: str
    total: float
    # scorer name -> replica name -> unweighted score in [0, 1]
    scores: Mapping[str, Mapping[str, float]]
    candidates: int


class Filter(Protocol):
    """Removes replicas that must not serve the request."""

    def filter(
        self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]
    ) -> Sequence[ReplicaSnapshot]: ...


class Scorer(Protocol):
    """Scores each candidate in [0, 1], higher is better; aligned with the input."""

    def score(
        self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]
    ) -> Sequence[float]: ...


class Picker(Protocol):
    """Chooses one candidate from weighted totals (aligned with the candidates)."""

    def pick(
        self,
        request: RequestFeatures,
        replicas: Sequence[ReplicaSnapshot],
        totals: Sequence[float],
    ) -> Pick: ...
