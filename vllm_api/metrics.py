"""Parse the parts of vLLM's Prometheus exposition the router reads (current names, then old)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

# Current v1 names first; vLLM removed the gpu_* spellings in late 2025 but older fleets send them.
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
_PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
# A counter: the wire name has _total; an exposition without the suffix is read all the same.
_PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")
_TTFT = "vllm:time_to_first_token_seconds_bucket"
_ITL = ("vllm:inter_token_latency_seconds_bucket", "vllm:time_per_output_token_seconds_bucket")


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    """One scrape of one replica: gauges, counters and cumulative histogram buckets."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    # Cumulative sequences the engine preempted (KV cache full: recomputed or swapped).
    preemptions: float | None = None
    requests_ok: float = 0.0
    requests_failed: float = 0.0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    running_adapters: frozenset[str] = frozenset()
    # le -> cumulative count, summed over label sets (one model per replica in practice).
    ttft_buckets: dict[float, float] = field(default_factory=dict)
    itl_buckets: dict[float, float] = field(default_factory=dict)


def _labels(raw: str) -> Iterator[tuple[str, str]]:
    """Label pairs of `k="v",k2="v2"` (escapes \\" \\\\ \\n handled)."""
    i, n = 0, len(raw)
    while i < n:
        eq = raw.index("=", i)
        key = raw[i:eq].strip().lstrip(",").strip()
        j = eq + 2  # skip ="
        out: list[str] = []
        while raw[j] != '"':
            if raw[j] == "\\":
                j += 1
                out.append("\n" if raw[j] == "n" else raw[j])
            else:
                out.append(raw[j])
            j += 1
        yield key, "".join(out)
        i = j + 1
        while i < n and raw[i] in ", ":
            i += 1


def parse_vllm_metrics(text: str) -> VllmMetrics:
    """Extract what routing needs; unknown families are skipped, malformed lines ignored."""
    values: dict[str, float] = {}
    ttft: dict[float, float] = {}
    itl: dict[float, float] = {}
    ok = failed = 0.0
    block_size = num_blocks = None
    adapters: frozenset[str] = frozenset()
    newest_lora = -math.inf
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        space = line.rfind(" ")
        if space < 0:
            continue
        name = line[:brace] if 0 <= brace < space else line[:space]
        try:
            value = float(line[space + 1 :])
        except ValueError:
            continue
        if name in (_TTFT, *_ITL) or name in (
            "vllm:cache_config_info",
            "vllm:lora_requests_info",
            "vllm:request_success_total",
        ):
            labels = dict(_labels(line[brace + 1 : line.rindex("}")])) if brace >= 0 else {}
            if name == _TTFT or name in _ITL:
                le = float(labels.get("le", "nan"))
                target = ttft if name == _TTFT else itl
                target[le] = target.get(le, 0.0) + value
            elif name == "vllm:cache_config_info":
                if labels.get("block_size", "").isdigit():
                    block_size = int(labels["block_size"])
                if labels.get("num_gpu_blocks", "").isdigit():
                    num_blocks = int(labels["num_gpu_blocks"])
            elif name == "vllm:lora_requests_info":
                # One series per adapter-set change, valued by its Unix time: the newest wins.
                if value > newest_lora:
                    newest_lora = value
                    adapters = frozenset(
                        a for a in labels.get("running_lora_adapters", "").split(",") if a
                    )
            elif labels.get("finished_reason") == "error":
                failed += value
            elif labels.get("finished_reason") != "abort":  # aborts are clients leaving
                ok += value
            continue
        values[name] = values.get(name, 0.0) + value

    def first(names: tuple[str, ...]) -> float | None:
        for n in names:
            if n in values:
                return values[n]
        return None

    return VllmMetrics(
        running=values.get("vllm:num_requests_running"),
        waiting=values.get("vllm:num_requests_waiting"),
        kv_usage=first(_KV_USAGE),
        prefix_queries=first(_PREFIX_QUERIES),
        prefix_hits=first(_PREFIX_HITS),
        preemptions=first(_PREEMPTIONS),
        requests_ok=ok,
        requests_failed=failed,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        running_adapters=adapters,
        ttft_buckets=ttft,
        itl_buckets=itl,
    )


def quantile_from_deltas(
    now: dict[float, float], before: dict[float, float], q: float
) -> float | None:
    """The q-quantile of the observations between two scrapes of a cumulative histogram."""
    edges = sorted(le for le in now if not math.isnan(le))
    if not edges:
        return None
    deltas = [max(0.0, now[le] - before.get(le, 0.0)) for le in edges]
    total = deltas[-1]
    if total <= 0:
        return None
    rank = q * total
    prev_edge, prev_count = 0.0, 0.0
    for le, count in zip(edges, deltas, strict=True):
        if count >= rank:
            if math.isinf(le):
                return prev_edge
            # Linear within the bucket, as Prometheus' histogram_quantile does.
            span = count - prev_count
            frac = (rank - prev_count) / span if span > 0 else 1.0
            return prev_edge + (le - prev_edge) * frac
        prev_edge, prev_count = le, count
    return prev_edge
