"""The gateway's Prometheus metrics: counters, histograms and the merged worker exposition."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
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

from telemetry.collectors import (
    DECISION_WINDOW,
    DecisionShare,
    Families,
    LiveGauges,
    SharedState,
    TenantQueues,
    WorkerInfo,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of a family: its series name (with _total, _bucket...), labels, value."""

    name: str
    labels: dict[str, str]
    value: float


# `_created` series double the exposition size and no autoscaler or dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

# LLM latencies span milliseconds (cached TTFT) to minutes (long non-streamed answers).
_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


class GatewayMetrics:
    """Counters and histograms of one gateway process (own registry: tests run several)."""

    def __init__(
        self,
        replica_state: Callable[[], Iterable[Mapping[str, Any]]],
        queue_depth: Callable[[], Mapping[tuple[str, str], int]] = dict,
        decision_window: int = DECISION_WINDOW,
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
            "Attempts abandoned before their first byte, by reason (each retried elsewhere unless "
            "max_retries or the retry budget stopped it: see llm_gateway_retries_refused_total).",
            ["replica", "reason"],
            registry=self.registry,
        )
        self._truncated = Counter(
            "llm_gateway_streams_truncated",
            "Streams that failed after their first byte (ended with an error event, no [DONE]).",
            ["model", "replica"],
            registry=self.registry,
        )
        self._retries_refused = Counter(
            "llm_gateway_retries_refused",
            "Retries not sent because the retry budget was spent (the last error was answered).",
            registry=self.registry,
        )
        self._quota_refusals = Counter(
            "llm_gateway_quota_refusals",
            "Requests refused (429) by their tenant's quota, by tenant and limit.",
            ["tenant", "limit"],
            registry=self.registry,
        )
        self._decisions = Counter(
            "llm_gateway_routing_decisions",
            "Routing decisions, one per upstream attempt (retries included), by replica and "
            "branch.",
            ["replica", "branch"],
            registry=self.registry,
        )
        self._model_versions = Counter(
            "llm_gateway_model_version_requests",
            "Requests bound to a model version ([traffic]), by public model and version.",
            ["model", "version"],
            registry=self.registry,
        )
        self._realtime = Counter(
            "llm_gateway_realtime_sessions",
            "/v1/realtime WebSocket sessions by model and how they ended (or were refused).",
            ["model", "outcome"],
            registry=self.registry,
        )
        self._share = DecisionShare(decision_window)
        self.registry.register(self._share)
        self.registry.register(LiveGauges(replica_state, queue_depth))
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

    def decision(self, replica: str, branch: str) -> None:
        """One routing decision (an attempt): where it went and by which branch."""
        self._child(self._decisions, replica, branch).inc()
        self._share.record(replica)

    def model_version(self, model: str, version: str) -> None:
        """A request of public `model` was bound to `version` (before routing)."""
        self._child(self._model_versions, model, version).inc()

    def first_token(self, model: str, ttft_s: float) -> None:
        self._child(self._ttft, model).observe(ttft_s)

    def retry(self, replica: str, reason: str) -> None:
        self._child(self._retries, replica, reason).inc()

    def retry_refused(self) -> None:
        self._retries_refused.inc()

    def quota_refused(self, tenant: str, limit: str) -> None:
        """A tenant's quota refused a request (tenant: a configured name or _other)."""
        self._child(self._quota_refusals, tenant, limit).inc()

    def track_tenant_queues(self, source: Callable[[], Mapping[str, int]]) -> None:
        """Report `source()` (waiting requests per tenant) at each scrape."""
        self.registry.register(TenantQueues(source))

    def track_shared_state(self, source: Callable[[], Mapping[str, float]]) -> None:
        """Report the shared-state link (`source()`: up, peers, op counters) at each scrape."""
        self.registry.register(SharedState(source))

    def realtime_session(self, model: str, outcome: str) -> None:
        """A /v1/realtime session ended, or was refused, with `outcome`."""
        self._child(self._realtime, model, outcome).inc()

    def stream_truncated(self, model: str, replica: str) -> None:
        self._child(self._truncated, model, replica).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def samples(self, families: Iterable[str]) -> dict[str, list[Sample]]:
        """The current samples of the named families, as plain values (no SDK type leaks)."""
        wanted = set(families)
        return {
            m.name: [Sample(s.name, dict(s.labels), float(s.value)) for s in m.samples]
            for m in self.registry.collect()
            if m.name in wanted
        }

    # --- Several workers (gateway/workers.py): any worker's scrape describes them all. ---

    def track_worker(self, pid: int, restarts: int) -> None:
        """Report this worker process's pid and its slot's restarts (told by the supervisor)."""
        self.registry.register(WorkerInfo(pid, restarts))

    def snapshot(self) -> bytes:
        """This process's families as JSON, for the worker answering a scrape to merge."""
        return json.dumps([_family_row(m) for m in self.registry.collect()]).encode()


def _family_row(m: Metric) -> list[Any]:
    samples = [[s.name, s.labels, s.value] for s in m.samples]
    return [m.name, m.documentation, m.type, m.unit, samples]


def merge_snapshots(parts: Iterable[tuple[int, bytes]]) -> bytes:
    """One exposition of (worker index, snapshot) pairs, each sample labelled with its worker."""
    families: dict[str, Metric] = {}
    answered = 0
    for worker, blob in parts:
        answered += 1
        label = str(worker)
        for name, doc, typ, unit, samples in json.loads(blob):
            family = families.get(name)
            if family is None:
                family = families[name] = Metric(name, doc, typ, unit)
            for sample, labels, value in samples:
                family.add_sample(sample, {**labels, "worker": label}, value)
    reporting = GaugeMetricFamily(
        "llm_gateway_workers_reporting",
        "Workers whose figures this scrape includes (one restarting or too slow is missing).",
    )
    reporting.add_metric([], answered)
    return generate_latest(Families([*families.values(), reporting]))
