"""The decision record: one logfmt line per routing decision, with every input to why."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import orjson

from gateway.proxy.requests import ParsedRequest
from routing.router import Router
from routing.types import Branch, Decision, RequestFeatures

# A decision line names the replicas holding the longest prefixes of the prompt, this many.
_PREFIX_MATCH_LOG_LIMIT = 4
# A logfmt value printed bare; anything else is JSON-quoted.
_BARE = re.compile(r"[^\s\"=\\]+")


def _logfmt(value: object) -> str:
    if value is None:
        return "-"
    text = str(value)
    return text if _BARE.fullmatch(text) else orjson.dumps(text).decode()


def _pairs(items: Iterable[tuple[str, str]]) -> str:
    return ",".join(f"{k}:{v}" for k, v in items) or "-"


def decision_line(
    router: Router,
    req: ParsedRequest,
    features: RequestFeatures,
    decision: Decision,
    attempt: int,
    tried: Sequence[str],
    router_branch: Branch,
) -> str:
    """The logfmt record of one routing decision: what was chosen, and every input to why."""
    chosen = decision.replica.name
    affinity, kind = router.affinity(features)
    match = sorted(features.prefix_match.items(), key=lambda kv: (-kv[1], kv[0]))
    running = sorted(features.inflight_match.items(), key=lambda kv: (-kv[1], kv[0]))
    totals = sorted(router.totals(decision).items(), key=lambda kv: (-kv[1], kv[0]))
    # The chosen replica's unweighted score from each scorer.
    scores = ((name, f"{by[chosen]:.4f}") for name, by in decision.scores.items() if chosen in by)
    fields: tuple[tuple[str, object], ...] = (
        ("request_id", req.request_id),
        ("model", req.model),
        ("attempt", attempt),
        ("replica", chosen),
        ("branch", decision.branch),
        ("router_branch", router_branch),
        ("total", f"{decision.total:.4f}"),
        ("candidates", decision.candidates),
        ("tried", ",".join(tried) or None),
        ("prompt_cache", features.prompt_cache_replica),
        ("session", features.session_replica),
        ("prefix_home", features.prefix_home_replica),
        ("affinity", affinity),
        ("affinity_kind", kind),
        ("blocks", len(features.block_hashes)),
        ("prefix_holders", len(match)),
        ("prefix_match", _pairs((r, str(n)) for r, n in match[:_PREFIX_MATCH_LOG_LIMIT])),
        ("inflight_match", _pairs((r, str(n)) for r, n in running[:_PREFIX_MATCH_LOG_LIMIT])),
        ("scores", _pairs(scores)),
        ("totals", _pairs((r, f"{t:.4f}") for r, t in totals)),
    )
    return " ".join(f"{key}={_logfmt(value)}" for key, value in fields)
