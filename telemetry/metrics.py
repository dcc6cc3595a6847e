"""The gateway's Prometheus metrics; the only module that imports prometheus_client."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_LATEST

# `_created` series double the exposition size and no autoscaler or dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

# LLM latencies span milliseconds (cached TTFT) to minutes (long non-streamed answers).
_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


class _LiveGauges(Collector):
    """Gauges read from live gateway state at scrape time, so the hot path never updates them."""

    def __init__(
        self,
        source: Callable[[], Iterable[Mapping[str, Any]]],
        queue_depth: Callable[[], Mapping[tuple[str, str], int]],
    ) -> None:
        self._source = source
        self._queue_depth = queue_depth

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "llm_gateway_in_flight_requests",
            "Requests the gateway has in flight to each replica.",
            labels=["replica"],
        )
        healthy = GaugeMetricFamily(
            "llm_gateway_replica_healthy",
            "1 when the replica passes health checks, else 0.",
            labels=["replica"],
        )
        freshness = GaugeMetricFamily(
            "llm_gateway_replica_metrics_freshness",
            "Trust in the replica's scraped metrics: 1 fresh, 0 stale or never scraped.",
            labels=["replica"],
        )
        age = GaugeMetricFamily(
            "llm_gateway_replica_metrics_age_seconds",
            "Seconds since the replica's last successful /metrics scrape.",
            labels=["replica"],
        )
        gpu_mem = GaugeMetricFamily(
            "gpu_vram_used_ratio",
            "GPU memory in use on the replica (heartbeat or NVML), 0..1.",
            labels=["replica"],
        )
        gpu_util = GaugeMetricFamily(
            "gpu_utilization_ratio",
            "GPU utilisation of the replica (heartbeat or NVML), 0..1.",
            labels=["replica"],
        )
        for row in self._source():
            name = [row["name"]]
            in_flight.add_metric(name, row["in_flight"])
            healthy.add_metric(name, 1.0 if row["healthy"] else 0.0)
            freshness.add_metric(name, row["freshness"])
            if row["metrics_age_s"] is not None:
                age.add_metric(name, row["metrics_age_s"])
            if row["gpu_mem_used_frac"] is not None:
                gpu_mem.add_metric(name, row["gpu_mem_used_frac"])
                gpu_util.add_metric(name, row["gpu_util"])
        queue = GaugeMetricFamily(
            "llm_request_queue_depth",
            "Requests waiting in the admission queue for a saturated fleet, by model and bucket.",
            labels=["model", "bucket"],
        )
        for (model, bucket), depth in self._queue_depth().items():
            queue.add_metric([model, bucket], depth)
        yield from (in_flight, healthy, freshness, age, gpu_mem, gpu_util, queue)


class GatewayMetrics:
    """Counters and histograms of one gateway process (own registry: tests run several)."""

    def __init__(
        self,
        replica_state: Callable[[], Iterable[Mapping[str, Any]]],
        queue_depth: Callable[[], Mapping[tuple[str, str], int]] = dict,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "llm_gateway_requests",
            "Requests answered, by model, replica, HTTP status and routing branch.",
            ["model", "replica", "status", "branch"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "llm_gateway_request_duration_seconds",
            "End-to-end request latency seen by the gateway.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._ttft = Histogram(
            "llm_gateway_time_to_first_token_seconds",
            "Time from request arrival to the first upstream byte of a stream.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._retries = Counter(
            "llm_gateway_upstream_retries",
            "Attempts abandoned before their first byte and retried elsewhere, by reason.",
            ["replica", "reason"],
            registry=self.registry,
        )
        self._truncated = Counter(
            "llm_gateway_streams_truncated",
            "Streams that failed after their first byte (ended with an error event, no [DONE]).",
            ["model", "replica"],
            registry=self.registry,
        )
        self.registry.register(_LiveGauges(replica_state, queue_depth))
        # prometheus_client's .labels() costs microseconds; cache children per label tuple.
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def request_done(
        self, model: str, replica: str, status: int, branch: str, duration_s: float
    ) -> None:
        self._child(self._requests, model, replica, str(status), branch).inc()
        self._child(self._latency, model).observe(duration_s)

    def first_token(self, model: str, ttft_s: float) -> None:
        self._child(self._ttft, model).observe(ttft_s)

    def retry(self, replica: str, reason: str) -> None:
        self._child(self._retries, replica, reason).inc()

    def stream_truncated(self, model: str, replica: str) -> None:
        self._child(self._truncated, model, replica).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
