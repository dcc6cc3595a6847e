"""Collectors read at scrape time: live gateway state, tenant queues, shared state, shares."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Decisions behind llm_gateway_routing_decision_share: enough for a steady share at tens of
# requests per second, few enough that a skew shows within seconds at hundreds.
DECISION_WINDOW = 1024


class LiveGauges(Collector):
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
            "1 when the replica is routable (up by health checks, not ejected), else 0.",
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
        scrapes = CounterMetricFamily(
            "llm_gateway_replica_scrapes",
            "Scrapes of the replica's /metrics sent by the score loop, failed ones included.",
            labels=["replica"],
        )
        interval = GaugeMetricFamily(
            "llm_gateway_replica_scrape_interval_seconds",
            "Seconds the score loop planned from the last good scrape to the next.",
            labels=["replica"],
        )
        foreign = GaugeMetricFamily(
            "llm_gateway_replica_foreign_in_flight",
            "Requests vLLM's /load counts on the replica beyond every gateway process's own.",
            labels=["replica"],
        )
        probes = CounterMetricFamily(
            "llm_gateway_replica_load_probes",
            "Reads of the replica's /load sent by the load probe, failed ones included.",
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
        # vLLM's own KV-cache usage, re-exported so an autoscaler needs only the gateway's scrape.
        kv_usage = GaugeMetricFamily(
            "llm_gateway_replica_kv_cache_usage_ratio",
            "KV-cache usage of the replica from its last /metrics scrape, 0..1.",
            labels=["replica"],
        )
        drained = GaugeMetricFamily(
            "llm_gateway_replica_drained",
            "1 while an operator drains the replica (routed nothing new), else 0.",
            labels=["replica"],
        )
        ejected, admit, ejections = self._outlier_families()
        for row in self._source():
            drained.add_metric([row["name"]], 1.0 if row.get("drained") else 0.0)
            # A replica no longer scraped (gone, or scaled away) must not hold its last value.
            if row.get("kv_usage") is not None and row["freshness"] > 0:
                kv_usage.add_metric([row["name"]], row["kv_usage"])
            name = [row["name"]]
            ejected.add_metric(name, 1.0 if row.get("ejected") else 0.0)
            admit.add_metric(name, row.get("admit_fraction", 1.0))
            for reason, count in row.get("ejections", {}).items():
                ejections.add_metric([row["name"], reason], count)
            in_flight.add_metric(name, row["in_flight"])
            healthy.add_metric(name, 1.0 if row["healthy"] else 0.0)
            freshness.add_metric(name, row["freshness"])
            if row["metrics_age_s"] is not None:
                age.add_metric(name, row["metrics_age_s"])
            scrapes.add_metric(name, row.get("scrapes_total", 0))
            if row.get("scrape_interval_s"):
                interval.add_metric(name, row["scrape_interval_s"])
            foreign.add_metric(name, row.get("foreign_in_flight", 0))
            probes.add_metric(name, row.get("load_probes_total", 0))
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
        yield from (in_flight, healthy, freshness, age, scrapes, interval, gpu_mem, gpu_util, queue)
        yield from (ejected, admit, ejections, kv_usage, drained, foreign, probes)

    @staticmethod
    def _outlier_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily]:
        ejected = GaugeMetricFamily(
            "llm_gateway_replica_ejected",
            "1 while outlier detection holds the replica out of service, else 0.",
            labels=["replica"],
        )
        admit = GaugeMetricFamily(
            "llm_gateway_replica_admit_fraction",
            "Share of routing decisions the replica takes part in: below 1 while it ramps up.",
            labels=["replica"],
        )
        ejections = CounterMetricFamily(
            "llm_gateway_outlier_ejections",
            "Replicas ejected by outlier detection, by reason.",
            labels=["replica", "reason"],
        )
        return ejected, admit, ejections


class TenantQueues(Collector):
    """Requests waiting in the admission queue per tenant, read at scrape time."""

    def __init__(self, source: Callable[[], Mapping[str, int]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "llm_gateway_tenant_queue_depth",
            "Requests waiting in the admission queue, by tenant (configured names; others "
            "as _other).",
            labels=["tenant"],
        )
        for tenant, n in self._source().items():
            depth.add_metric([tenant], n)
        yield depth


class SharedState(Collector):
    """The link to the shared-state Redis, read at scrape time."""

    def __init__(self, source: Callable[[], Mapping[str, float]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        row = self._source()
        gauges = (
            (
                "up",
                "up",
                "1 while routing state is shared through Redis, 0 while routing from local state.",
            ),
            ("peers", "peers", "Other gateway processes whose in-flight lease this process reads."),
            (
                "scrape_leases",
                "scrape_leases",
                "Replicas whose /metrics this process scrapes for every process sharing state.",
            ),
            (
                "remote_inflight",
                "inflight_remote",
                "Other processes' requests in flight whose prefixes this process follows.",
            ),
        )
        for name, key, text in gauges:
            if key in row:
                gauge = GaugeMetricFamily(f"llm_gateway_shared_state_{name}", text)
                gauge.add_metric([], row[key])
                yield gauge
        for name, key, text in (
            ("failed_ops", "failed_ops", "Redis operations that failed or timed out."),
            ("late_ops", "late_ops", "Timeouts within late_grace_s: decided alone, kept up."),
            ("outcomes_published", "published", "Routing outcomes this process published."),
            ("outcomes_applied", "applied", "Other processes' routing outcomes applied here."),
            ("outcomes_stale", "stale_local", "Outcomes older than the local entry: ignored."),
            ("writes_rejected", "rejected_stale", "Writes Redis refused as older than it held."),
            ("scrapes_published", "scrapes_published", "Scrape results published to the others."),
            ("scrapes_applied", "scrapes_applied", "Other processes' scrape results applied here."),
            ("scrapes_stale", "scrapes_stale", "Scrape results older than the local one: ignored."),
            ("inflight_published", "inflight_told", "Requests in flight told to the others."),
            ("inflight_applied", "inflight_applied", "Other processes' requests in flight held."),
            ("picks_published", "picks_told", "Routing picks told to the others' share windows."),
            ("picks_applied", "picks_applied", "Other processes' routing picks counted here."),
        ):
            if key not in row:
                continue  # scrapes not shared ([shared_state] share_scrapes off)
            family = CounterMetricFamily(f"llm_gateway_shared_state_{name}", text)
            family.add_metric([], row[key])
            yield family


class DecisionShare(Collector):
    """Each replica's share of the last `window` routing decisions, read at scrape time.

    A window of decisions, not of time: the share means the same at any request rate and
    any scrape interval, and one skewed burst shows up within `window` decisions.
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"decision window must be >= 1, got {window}")
        self.window = window
        self._ring: list[str | None] = [None] * window
        self._at = 0
        self._counts: dict[str, int] = {}

    def record(self, replica: str) -> None:
        ring, at, counts = self._ring, self._at, self._counts
        old = ring[at]
        if old is not None:
            counts[old] -= 1
        ring[at] = replica
        counts[replica] = counts.get(replica, 0) + 1
        self._at = (at + 1) % self.window

    def collect(self) -> Iterator[Metric]:
        share = GaugeMetricFamily(
            "llm_gateway_routing_decision_share",
            f"Each replica's share of the last {self.window} routing decisions "
            "(retried attempts included), 0..1.",
            labels=["replica"],
        )
        # A copy: nothing promises render() runs on the thread that records.
        counts = list(self._counts.items())
        seen = sum(n for _, n in counts)
        for replica, n in counts:
            if n > 0:
                share.add_metric([replica], n / seen)
        window = GaugeMetricFamily(
            "llm_gateway_routing_decision_window",
            "Routing decisions the share gauge currently covers (at most its window).",
        )
        window.add_metric([], seen)
        yield from (share, window)


class WorkerInfo(Collector):
    """This worker's pid (an info gauge) and its slot's restarts."""

    def __init__(self, pid: int, restarts: int) -> None:
        self._pid = str(pid)
        self._restarts = restarts

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "llm_gateway_worker_info", "1 for each gateway worker process.", labels=["pid"]
        )
        info.add_metric([self._pid], 1.0)
        restarts = CounterMetricFamily(
            "llm_gateway_worker_restarts",
            "Times the supervisor restarted this worker's slot after its process died.",
        )
        restarts.add_metric([], self._restarts)
        yield from (info, restarts)


class Families(Collector):
    """Families built elsewhere (merged snapshots), as a collector for generate_latest."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self._families
