"""Values and contracts of the routing pipeline: features and snapshots in, a Decision out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import Any, Literal, Protocol, TypeVar

_T = TypeVar("_T")


class _Factory:
    """The default of a field built by its default_factory (shown as dataclasses shows it)."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def _slot_init(cls: type[_T]) -> type[_T]:
    """Give a frozen slots dataclass an __init__ that sets each slot through its descriptor."""
    # The dataclass's own frozen __init__ calls object.__setattr__ per field (~0.12 us each):
    # ~3 us for RequestFeatures, built three times a request, and a ReplicaSnapshot per
    # changed replica per decision. Same signature, defaults and factories; 2-3x faster.
    ns: dict[str, Any] = {"_FACTORY": _FACTORY}
    params, body = [], []
    for f in fields(cls):  # type: ignore[arg-type]
        if not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: init=False is not supported")
        ns[f"_s_{f.name}"] = getattr(cls, f.name).__set__
        if f.default is not MISSING:
            ns[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
            value = f.name
        elif f.default_factory is not MISSING:
            ns[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
            value = f"_f_{f.name}() if {f.name} is _FACTORY else {f.name}"
        else:
            params.append(f.name)
            value = f.name
        body.append(f"    _s_{f.name}(self, {value})\n")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: __post_init__ is not supported")
    exec(f"def __init__(self, {', '.join(params)}) -> None:\n{''.join(body)}", ns)
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    setattr(cls, "__init__", init)  # noqa: B010 (mypy: no assigning to a method)
    return cls


class RoutingError(Exception):
    """Root error of the routing package."""


class NoReplicaError(RoutingError):
    """No replica survived the filters for this request."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"no replica for model {model!r}: {reason}")
        self.model = model
        self.reason = reason


class Saturated(NoReplicaError):
    """A saturating filter removed the last candidates: wait for capacity rather than fail."""


class PluginConfigError(RoutingError):
    """A profile names an unknown plugin, repeats one, or gives it bad parameters."""


class Branch(StrEnum):
    """Why a request went where it went: the label of metrics, traces and logs."""

    # The picker followed request.affinity_replica, by its affinity_kind.
    PROMPT_CACHE_HIT = "prompt_cache_hit"
    SESSION = "session"
    PREFIX_HOME = "prefix_home"
    # A replica holding a prefix of the prompt (tier 2) won.
    PREFIX_HIT = "prefix_hit"
    # A cached replica existed but was over its load guard: placed by load.
    LOAD_GUARD = "load_guard"
    # A cached replica existed but had more than its share of recent picks: placed by load.
    SHARE_GUARD = "share_guard"
    # Nothing cached anywhere: placed by load.
    MISS_BY_LOAD = "miss_by_load"
    MAX_SCORE = "max_score"
    MAX_SCORE_TIE = "max_score_tie"
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    # Set by the gateway: the request's instance class (the length_class filter) had no
    # candidate, so it went to a replica outside the class.
    CLASS_FALLBACK = "class_fallback"
    # Set by the gateway: the request waited in the admission queue, then was routed.
    QUEUED = "queued"
    # Set by the gateway: the request was refused before any replica was chosen.
    NONE = "none"


# A cache tier that may name an affinity replica; a profile's `affinity` orders them.
Tier = Literal["prompt_cache", "session", "prefix_home"]
TIERS: tuple[Tier, ...] = ("prompt_cache", "session", "prefix_home")


@_slot_init
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
    # False when a replica ramping up after a return sits this decision out: the gateway
    # admits it to a growing share of decisions; the healthy filter drops it.
    admitted: bool = True


@_slot_init
@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What the router knows about one request (extracted once, on arrival)."""

    model: str
    request_id: str = ""
    prompt_tokens: int = 0
    # The templated prompt's characters when prompt_tokens was estimated from them (no
    # tokenizer), else 0: the gateway learns the estimate's ratio from the replicas' counts.
    prompt_chars: int = 0
    # Admission-queue bucket of prompt_tokens, named from [admission].buckets ("le128", ...)
    # by the gateway's cache-index lookup; "" until then.
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
    # Leading blocks that requests still in flight on a replica carry, where deeper than its
    # prefix_match: a prefix being computed there now, not yet in the index.
    inflight_match: Mapping[str, int] = field(default_factory=dict)
    # Prompt tokens per block of block_hashes (the replicas' block size, or block_chars over
    # the characters per token the gateway estimates).
    block_tokens: int = 16
    # Each tier's candidate, as the cache index reports it: the replica that last served this
    # prompt (tier 1), this session, and, when no replica holds any of the prompt, the
    # replica its prefix was last sent to (a prefix vLLM evicted goes back there).
    prompt_cache_replica: str | None = None
    session_replica: str | None = None
    prefix_home_replica: str | None = None
    # The candidate of the profile's first tier that has one (the Router sets both before
    # its plugins run); a request that arrives with affinity_replica set keeps it.
    affinity_replica: str | None = None
    affinity_kind: Tier | None = None
    # Replica labels the client asks for (`x-model-hint: arch=int4` -> {"arch": "int4"}; parsed
    # by gateway/proxy/hints.py), matched against ReplicaSnapshot.labels by the label filter.
    hints: Mapping[str, str] = field(default_factory=dict)
    # Replica labels the request's model version requires (set by the gateway's version stage,
    # gateway/proxy/versions.py): a hard constraint, kept by the model_version filter.
    version_labels: Mapping[str, str] = field(default_factory=dict)
    # The client's `X-Canary-Weight` (0..100), honoured by the version stage only when allowed.
    canary_weight: int | None = None


@_slot_init
@dataclass(frozen=True, slots=True)
class Pick:
    """A picker's choice: index into the candidate list and a branch label."""

    index: int
    branch: Branch


@_slot_init
@dataclass(frozen=True, slots=True)
class Decision:
    """The router's answer: where to send the request, why, and every score."""

    replica: ReplicaSnapshot
    branch: Branch
    total: float
    # scorer name -> replica name -> unweighted score in [0, 1]
    scores: Mapping[str, Mapping[str, float]]
    candidates: int


class Filter(Protocol):
    """Removes replicas that must not serve the request."""

    # A filter class may set `saturating = True`: it removes replicas only while they are
    # full, so when it removes the last candidates the Router raises Saturated (the gateway
    # queues the request) instead of NoReplicaError.

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
