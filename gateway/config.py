"""The gateway's TOML configuration: frozen dataclasses, one place for every default."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gateway.admin.config import DiscoveryConfig
from gateway.config_loader import ConfigError, load_dataclass
from gateway.grpc.config import GrpcConfig
from gateway.proxy.headers import check_forwarding
from gateway.proxy.tenancy_config import TenancyConfig
from gateway.replicas.outlier import OutlierConfig, with_alias
from gateway.shared_state.config import SharedStateConfig
from gateway.versions_config import TrafficConfig, check_profile
from routing.profile import ProfileSpec


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The HTTP front end."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 4 * 1024 * 1024
    # The audio routes' multipart bodies (vLLM's own upload limit is 25 MB).
    max_audio_body_bytes: int = 25 * 1024 * 1024
    # Seconds to let in-flight streams finish after SIGTERM before aborting them.
    drain_timeout_s: float = 30.0
    # Seconds a client may take to send its headers and body (slowloris guard).
    request_receive_timeout_s: float = 30.0
    request_id_header: str = "x-request-id"
    # Gateway API keys; empty = no authentication at the gateway.
    api_keys: tuple[str, ...] = ()
    # Keys of /admin/* and /metrics; empty = /admin/* answers loopback clients only.
    admin_keys: tuple[str, ...] = ()
    # Request line plus headers: a larger head gets 431 before the parser buffers it all.
    max_header_bytes: int = 32768
    max_headers: int = 100
    # Seconds from connection open, or a head's first byte, to the end of the head (408).
    header_timeout_s: float = 10.0
    # Open client connections; one more is answered 503 and closed. 0 = unlimited.
    max_connections: int = 4096
    # Open connections from one client address (503 past it); 0 = unlimited. Loopback and
    # trusted_proxies are not counted: a proxy there carries many clients.
    max_connections_per_client: int = 256
    # Seconds a response may make no progress into a client that stopped reading before the
    # connection is closed (and the upstream request cancelled); nginx's send_timeout.
    send_timeout_s: float = 60.0
    # Idle seconds between requests on a kept-alive connection before it is closed.
    keepalive_timeout_s: float = 5.0
    # After an answer sent before the request body was read (413, 401, ...): how long, and how
    # many bytes, the rest of the body is read and dropped so the client can read the answer.
    linger_timeout_s: float = 30.0
    linger_max_bytes: int = 256 * 1024 * 1024
    # Extra client headers forwarded upstream; credentials (authorization, cookie, x-api-key,
    # proxy-authorization) are dropped unless named here.
    forward_headers: tuple[str, ...] = ()
    # CIDRs whose X-Forwarded-For / X-Forwarded-Proto are kept (and appended to); others' are
    # replaced by the peer's address and scheme.
    trusted_proxies: tuple[str, ...] = ()
    # Gateway processes sharing the listener (SO_REUSEPORT; gateway/supervisor.py); 0 = one
    # per core. `--workers` overrides it.
    workers: int = 1
    # /v1/realtime (WebSocket): the largest message either way (1009 past it), the seconds a
    # session may pass with no message either way, and the sessions open at once (503 past
    # it; each holds one of the loops' pooled connections to its replica until it closes).
    realtime_max_message_bytes: int = 16 * 1024 * 1024
    realtime_idle_timeout_s: float = 120.0
    realtime_max_sessions: int = 256

    def __post_init__(self) -> None:
        for name in ("realtime_max_message_bytes", "realtime_idle_timeout_s"):
            _positive(name, getattr(self, name))
        _positive("realtime_max_sessions", self.realtime_max_sessions)
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = one per core), got {self.workers}")
        # A key in both lists would let every API client reach the admin routes.
        if set(self.api_keys) & set(self.admin_keys):
            raise ValueError("admin_keys must not repeat a key of api_keys")
        _positive("max_body_bytes", self.max_body_bytes)
        _positive("max_audio_body_bytes", self.max_audio_body_bytes)
        _positive("drain_timeout_s", self.drain_timeout_s)
        _positive("request_receive_timeout_s", self.request_receive_timeout_s)
        _positive("max_header_bytes", self.max_header_bytes)
        _positive("max_headers", self.max_headers)
        _positive("header_timeout_s", self.header_timeout_s)
        if self.max_connections < 0:
            raise ValueError(f"max_connections must be >= 0, got {self.max_connections}")
        if self.max_connections_per_client < 0:
            raise ValueError(
                f"max_connections_per_client must be >= 0, got {self.max_connections_per_client}"
            )
        for name in ("send_timeout_s", "keepalive_timeout_s", "linger_timeout_s"):
            _positive(name, getattr(self, name))
        _positive("linger_max_bytes", self.linger_max_bytes)
        check_forwarding(self.forward_headers, self.trusted_proxies)


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """The requests' client to the replicas (proxy/http_client.py) and the loops' session."""

    # Bearer key sent to replicas; the client's own Authorization is never forwarded.
    api_key: str = ""
    connect_timeout_s: float = 2.0
    # Streams: the longest wait for the first chunk, then between chunks (no total deadline).
    first_byte_timeout_s: float = 120.0
    # Streams: the longest wait for the response head (vLLM sends it once the request is
    # tokenised, before it queues); silent this long, the replica is retried elsewhere.
    # Non-streamed answers come with their head, so only non_stream_timeout_s bounds them.
    response_head_timeout_s: float = 30.0
    idle_timeout_s: float = 60.0
    # Non-streamed answers arrive in one piece after the whole generation.
    non_stream_timeout_s: float = 600.0
    max_connections: int = 2048
    max_connections_per_replica: int = 512
    keepalive_timeout_s: float = 30.0
    # Extra attempts on other replicas when one fails before its first byte.
    max_retries: int = 2
    # Retries in flight at once: at most this share of the active requests, or
    # min_retry_concurrency if that is more (Envoy's retry budget); over it, no retry.
    retry_budget_ratio: float = 0.2
    min_retry_concurrency: int = 3

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "first_byte_timeout_s", "idle_timeout_s"):
            _positive(name, getattr(self, name))
        _positive("response_head_timeout_s", self.response_head_timeout_s)
        if not 0.0 <= self.retry_budget_ratio <= 1.0:
            raise ValueError(f"retry_budget_ratio must be in [0, 1], got {self.retry_budget_ratio}")
        if self.min_retry_concurrency < 0:
            raise ValueError("min_retry_concurrency must be >= 0")
        _positive("non_stream_timeout_s", self.non_stream_timeout_s)
        _positive("max_connections", self.max_connections)
        _positive("max_connections_per_replica", self.max_connections_per_replica)
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")


@dataclass(frozen=True, slots=True)
class HealthCheckConfig:
    """Active health checks and model discovery."""

    interval_s: float = 2.0
    timeout_s: float = 1.0
    path: str = "/health"
    healthy_threshold: int = 1
    unhealthy_threshold: int = 2
    # Deprecated alias of [outlier] consecutive_failures: nonzero, it wins; 0 = use that.
    passive_failure_threshold: int = 0

    def __post_init__(self) -> None:
        _positive("interval_s", self.interval_s)
        _positive("timeout_s", self.timeout_s)
        _positive("healthy_threshold", self.healthy_threshold)
        _positive("unhealthy_threshold", self.unhealthy_threshold)
        if self.passive_failure_threshold < 0:
            raise ValueError("passive_failure_threshold must be >= 0")


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """One vLLM replica."""

    url: str
    name: str = ""
    # Served model and LoRA names; empty = discovered from the replica's /v1/models.
    models: tuple[str, ...] = ()
    weight: float = 1.0
    labels: dict[str, str] = field(default_factory=dict)
    # NVML device indices of this replica, when the gateway runs on its GPU host (sidecar).
    gpu_indices: tuple[int, ...] = ()
    # vLLM KV-cache events: "" = none (approximate prefix index), "auto" = the endpoint the
    # replica reports on GET /kv_event_sources, else a ZMQ endpoint to connect to.
    kv_events: str = ""
    # The replica runs vLLM with `--scheduling-policy priority`: the gateway sends each
    # request's class (P0..P2) as its `priority` (see gateway/proxy/versions.py).
    priority_scheduling: bool = False

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://host[:port], got {self.url!r}")
        if self.weight < 0:
            raise ValueError(f"weight must be >= 0, got {self.weight}")
        if not self.name:
            object.__setattr__(self, "name", f"{parts.hostname}:{parts.port or 80}")
        object.__setattr__(self, "url", self.url.rstrip("/"))


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """Which profile routes requests; user profiles add to (or replace) the built-in ones."""

    profile: str = "default"
    # Routing's own specs: [routing.profiles.<name>] is loaded straight into them.
    profiles: dict[str, ProfileSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A profile is named by its key; a `name` key in its table may only repeat it.
        named: dict[str, ProfileSpec] = {}
        for key, spec in self.profiles.items():
            if spec.name not in ("", key):
                raise ValueError(f"profiles.{key}.name must be {key!r}, not {spec.name!r}")
            named[key] = spec if spec.name == key else replace(spec, name=key)
        object.__setattr__(self, "profiles", named)


@dataclass(frozen=True, slots=True)
class ScoreLoopConfig:
    """How replica state is kept fresh: an adaptive /metrics cadence per replica.

    A scrape costs the replica's API server CPU and holds its event loop, the process that
    streams the tokens (measured in docs/vllm-cpu.md, "Cost of a /metrics scrape"). So each
    replica is scraped only as often as it adds to what the gateway already knows (its own
    in-flight requests, exactly): every `scrape_interval_s` while the scraped load
    disagrees with that accounting or changes fast, backing off to `steady_scrape_interval_s`
    while they agree, and to `idle_scrape_interval_s` when nothing is routed there
    (gateway/replicas/cadence.py).
    """

    # The fastest cadence; a bound above the slower ones fixes the cadence at it.
    scrape_interval_s: float = 0.25
    # The slowest while the replica has work or was routed to lately, and while idle.
    steady_scrape_interval_s: float = 2.0
    idle_scrape_interval_s: float = 5.0
    # Sustained scrapes per replica, whatever the cadence wants (bursts of 4 s of it).
    max_scrapes_per_s: float = 1.0
    scrape_timeout_s: float = 0.5
    # vLLM's cheap GET /load between scrapes (--enable-server-load-tracking): this often while
    # the replica has work or the gateway routes, else at the idle bound; 0 = never.
    load_interval_s: float = 0.25
    load_timeout_s: float = 0.5
    # A scrape this late (past the interval the loop chose) starts losing trust, linearly,
    # down to none at 5x this late; data the loop chose not to refresh keeps it.
    stale_after_s: float = 1.0
    # TTFT / inter-token percentiles and error rates cover this much recent history.
    latency_window_s: float = 30.0
    # Worker heartbeats (GPU memory / utilisation) older than this are ignored.
    heartbeat_stale_s: float = 10.0
    # NVML on this host: "auto" (use it when present), "off".
    nvml: str = "auto"

    def __post_init__(self) -> None:
        # Every duration and rate must be > 0 but these: /load may be off, heartbeats unchecked.
        for f in fields(self):
            if f.type == "float" and f.name not in ("load_interval_s", "heartbeat_stale_s"):
                _positive(f.name, getattr(self, f.name))
        if self.load_interval_s < 0:
            raise ValueError("load_interval_s must be >= 0")
        if self.nvml not in ("auto", "off"):
            raise ValueError(f"nvml must be 'auto' or 'off', got {self.nvml!r}")


@dataclass(frozen=True, slots=True)
class CacheIndexConfig:
    """The three-tier cache index: prompt and session affinity, per-replica prefix blocks."""

    # Directory with the replicas' tokenizer.json / tokenizer_config.json, or "builtin" (the
    # simulator's tokenizer); empty = no tokenizer: prefixes are hashed as character blocks.
    # KV events (precise mode) need the replicas' own tokenizer.
    tokenizer: str = ""
    # Token block size of the replicas (vLLM --block-size); used with a tokenizer.
    block_size: int = 16
    # Characters per block without a tokenizer (64 characters ~ 16 tokens).
    block_chars: int = 64
    prompt_cache_ttl_s: float = 60.0
    max_prompts: int = 100_000
    # Header carrying a session id; the body's `user` field is the fallback.
    session_header: str = "x-session-id"
    session_ttl_s: float = 600.0
    max_sessions: int = 100_000
    # Blocks assumed per replica until its vllm:cache_config_info is scraped.
    default_capacity_blocks: int = 16_384
    # Approximate mode remembers this many times a replica's cache of routing history, so
    # a prefix vLLM evicted under pressure still routes back to the replica that had it
    # (recomputed there) instead of being placed anew: a stable prefix-to-replica map.
    history_ratio: float = 4.0
    # Memory bound of the whole prefix index; `llm-gateway bench routing-cost` measures the
    # bytes per block (benchmarks/routing_cost.py).
    max_total_blocks: int = 2_000_000
    # Stored Responses remembered (response id -> the replica that keeps it), LRU beyond.
    max_responses: int = 100_000

    def __post_init__(self) -> None:
        for name in ("block_size", "block_chars", "max_prompts", "max_sessions", "max_responses"):
            _positive(name, getattr(self, name))
        for name in ("prompt_cache_ttl_s", "session_ttl_s"):
            _positive(name, getattr(self, name))
        _positive("default_capacity_blocks", self.default_capacity_blocks)
        _positive("history_ratio", self.history_ratio)
        _positive("max_total_blocks", self.max_total_blocks)


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Tier 3: per-bucket admission queues used while every eligible replica is saturated.

    A replica is saturated by the `saturation` filter of the routing profile (the default
    profile has it); without that filter nothing is ever queued.
    """

    enabled: bool = True
    # Upper prompt-token limits of the buckets (a last unbounded bucket is added).
    buckets: tuple[int, ...] = (128, 512)
    # Waiting requests per tenant, model and bucket: one tenant cannot fill it for the others.
    max_depth: int = 1024
    max_wait_s: float = 30.0
    # Dispatch share of the longer bucket while both are backlogged (no starvation).
    long_share: float = 0.2

    def __post_init__(self) -> None:
        _positive("max_depth", self.max_depth)
        _positive("max_wait_s", self.max_wait_s)
        if not 0 < self.long_share <= 0.5:
            raise ValueError(f"long_share must be in (0, 0.5], got {self.long_share}")
        if any(b <= 0 for b in self.buckets) or list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"buckets must be positive and increasing, got {self.buckets}")


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """Prometheus metrics and OpenTelemetry traces."""

    metrics_enabled: bool = True
    # OTLP/HTTP traces endpoint (e.g. http://otel-collector:4318/v1/traces); "" = no tracing.
    tracing_endpoint: str = ""
    # Share of requests traced when the client sent no sampled trace context.
    tracing_sample_ratio: float = 1.0
    tracing_service_name: str = "llm-gateway"
    # "text" lines or "json" (one object per line, every `extra` field a key).
    log_format: str = "text"
    # One INFO record per request (id, tenant, model, replica, branch, status, TTFT, tokens,
    # duration) on the logger llm_gateway.request.
    request_log: bool = False

    def __post_init__(self) -> None:
        if self.log_format not in ("text", "json"):
            raise ValueError(f'log_format must be "text" or "json", got {self.log_format!r}')
        if not 0.0 <= self.tracing_sample_ratio <= 1.0:
            raise ValueError(
                f"tracing_sample_ratio must be in [0, 1], got {self.tracing_sample_ratio}"
            )


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """The whole configuration file."""

    server: ServerConfig = field(default_factory=ServerConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    health_check: HealthCheckConfig = field(default_factory=HealthCheckConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    score_loop: ScoreLoopConfig = field(default_factory=ScoreLoopConfig)
    cache_index: CacheIndexConfig = field(default_factory=CacheIndexConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    grpc: GrpcConfig = field(default_factory=GrpcConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    outlier: OutlierConfig = field(default_factory=OutlierConfig)
    tenancy: TenancyConfig = field(default_factory=TenancyConfig)
    shared_state: SharedStateConfig = field(default_factory=SharedStateConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    traffic: TrafficConfig = field(default_factory=TrafficConfig)
    replicas: tuple[ReplicaConfig, ...] = ()

    def __post_init__(self) -> None:
        alias = self.health_check.passive_failure_threshold
        object.__setattr__(self, "outlier", with_alias(self.outlier, alias))
        self.tenancy.check_keys(self.server.api_keys, self.server.admin_keys)
        check_profile(self.traffic, self.routing.profile, self.routing.profiles)
        names = [r.name for r in self.replicas]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate replica names: {', '.join(dupes)}")


def parse_config(data: Mapping[str, Any]) -> GatewayConfig:
    """Build a GatewayConfig from parsed TOML, strictly."""
    return load_dataclass(GatewayConfig, data)


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a TOML configuration file."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    return parse_config(data)
