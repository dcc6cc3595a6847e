"""Engine statistics rendered in Prometheus text with vLLM's v1 metric names and labels."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# Bucket edges as vLLM's v1 PrometheusStatLogger declares them.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error")


class Histogram:
    """Cumulative-bucket histogram; observe_n records n equal samples in one call."""

    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe_n(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.buckets, value)] += n
        self.sum += value * n
        self.count += n

    def render(self, name: str, labels: str, out: list[str]) -> None:
        acc = 0
        for edge, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            out.append(f'{name}_bucket{{{labels},le="{edge}"}} {float(acc)}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        out.append(f"{name}_count{{{labels}}} {float(self.count)}")
        out.append(f"{name}_sum{{{labels}}} {self.sum}")


@dataclass(slots=True)
class EngineStats:
    """Counters and histograms the engine updates; gauges are read live at render time."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    success: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    prefill: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    # (running adapters, waiting adapters) -> Unix time that label set was last seen.
    lora_info: dict[tuple[str, str], float] = field(default_factory=dict)
    # /metrics bodies rendered: what the scrapers cost the replica, counted on its side (not
    # exposed: vLLM has no such family).
    renders: int = 0


@dataclass(frozen=True, slots=True)
class Gauges:
    running: int
    waiting: int
    kv_usage: float


def _metric(out: list[str], name: str, kind: str, help_: str) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")


def render(
    stats: EngineStats,
    gauges: Gauges,
    *,
    model: str,
    cache_info: dict[str, str],
    max_lora: int | None,
) -> bytes:
    """The /metrics body (text format 0.0.4); counted in `stats.renders`."""
    stats.renders += 1
    lb = f'model_name="{model}",engine="0"'
    out: list[str] = []
    for name, help_, value in (
        ("vllm:num_requests_running", "Number of requests in model execution batches.",
         gauges.running),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
         gauges.waiting),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
         gauges.kv_usage),
    ):  # fmt: skip
        _metric(out, name, "gauge", help_)
        out.append(f"{name}{{{lb}}} {float(value)}")
    for name, help_, value in (
        ("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
         stats.preemptions),
        ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
         "tokens.", stats.prefix_queries),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
         stats.prefix_hits),
        ("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
        ("vllm:generation_tokens", "Number of generation tokens processed.",
         stats.generation_tokens),
    ):  # fmt: skip
        _metric(out, name + "_total", "counter", help_)
        out.append(f"{name}_total{{{lb}}} {float(value)}")
    _metric(
        out, "vllm:request_success_total", "counter", "Count of successfully processed requests."
    )
    for reason, value in stats.success.items():
        out.append(f'vllm:request_success_total{{{lb},finished_reason="{reason}"}} {float(value)}')
    for name, help_, hist in (
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
         stats.ttft),
        ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
         stats.itl),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
         stats.e2e),
        ("vllm:request_queue_time_seconds",
         "Histogram of time spent in WAITING phase for request.", stats.queue),
        ("vllm:request_prefill_time_seconds",
         "Histogram of time spent in PREFILL phase for request.", stats.prefill),
    ):  # fmt: skip
        _metric(out, name, "histogram", help_)
        hist.render(name, lb, out)
    _metric(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    info = ",".join(f'{k}="{v}"' for k, v in cache_info.items())
    out.append(f'vllm:cache_config_info{{{info},engine="0"}} 1.0')
    if max_lora is not None:
        _metric(out, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.")
        for (running, waiting), stamp in stats.lora_info.items():
            out.append(
                f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters='
                f'"{running}",waiting_lora_adapters="{waiting}"}} {stamp}'
            )
    out.append("")
    return "\n".join(out).encode()
