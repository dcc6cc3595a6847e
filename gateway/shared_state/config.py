"""The `[shared_state]` TOML table: Redis shared by every gateway process ("" = this one alone)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class SharedStateConfig:
    """Where the routing state of several gateway processes meets, and how hard to lean on it."""

    # redis://host:port/db (or rediss://, unix://); "" = no sharing, this process alone.
    url: str = ""
    # Prefix of every key and of the channel, so several gateways may share one Redis.
    key_prefix: str = "llmgw"
    # The one Redis wait on a request's path (a quota reserve): past it, decide locally.
    op_timeout_s: float = 0.005
    # Background round trips (publish, leases, in-flight reads, settles, bootstrap chunks).
    batch_timeout_s: float = 0.25
    connect_timeout_s: float = 0.5
    # Round trips may time out this long, none answered, before this process stops sharing
    # (a refused connection stops it at once); each late one still falls back alone.
    late_grace_s: float = 1.0
    # Routing outcomes are batched for this long, then published and written in one pipeline.
    flush_interval_s: float = 0.01
    # A change of this process's in-flight counts reaches the others with the next flush,
    # sent at most this long after it (shared_state/counts.py): until then they do not see
    # this process's new requests, and two processes may pick the same idle replica.
    inflight_poll_s: float = 0.01
    # How often this process's lease is rewritten and the others' read, busy or not: it heals
    # pushed counts a lost message left wrong, and drops a dead process's (once its lease ran
    # out, at the next beat). A beat costs ~0.2 ms of CPU here, ~0.05 ms in Redis (measured).
    inflight_idle_poll_s: float = 0.25
    # A process's in-flight lease (and quota slots) outlive its last write by this long.
    lease_ttl_s: float = 3.0
    # Reconnect backoff while Redis is unreachable: doubles from min to max.
    reconnect_min_s: float = 0.05
    reconnect_max_s: float = 2.0
    # Connections of this process's pool (pub/sub holds one).
    max_connections: int = 8
    # Outcomes waiting to be published; the oldest are dropped past it (Redis down).
    max_pending: int = 10_000
    # Leading block hashes one outcome carries (deeper blocks rarely change a decision).
    max_event_blocks: int = 1024
    # Bounds of the bootstrap state in Redis (entries also expire with the cache TTLs).
    max_prompts: int = 100_000
    max_sessions: int = 100_000
    max_blocks_per_replica: int = 65_536
    # Seconds a replica's prefix placements stay in Redis after its last write.
    prefix_ttl_s: float = 600.0
    # Tenants' quotas counted in Redis (across processes) rather than per process.
    quotas: bool = True
    # One process scrapes each replica's /metrics for every process (a lease per replica) and
    # publishes what it read: the score loop's budget then holds fleet-wide (shared_state/
    # scrapes.py). False, or Redis unreachable: each process scrapes on its own.
    share_scrapes: bool = True
    # A replica's scrape lease outlives its owner's last renewal by this long: a dead owner's
    # replicas are taken over by the others past it.
    scrape_lease_ttl_s: float = 1.0

    def __post_init__(self) -> None:
        if self.url and urlsplit(self.url).scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"url must be redis://, rediss:// or unix://, got {self.url!r}")
        if not self.key_prefix or any(c in self.key_prefix for c in " {}"):
            raise ValueError(
                f"key_prefix must be non-empty, without spaces or braces: {self.key_prefix!r}"
            )
        for name in (
            "op_timeout_s",
            "batch_timeout_s",
            "connect_timeout_s",
            "flush_interval_s",
            "inflight_poll_s",
            "inflight_idle_poll_s",
            "lease_ttl_s",
            "reconnect_min_s",
            "reconnect_max_s",
            "max_connections",
            "max_pending",
            "max_event_blocks",
            "max_prompts",
            "max_sessions",
            "max_blocks_per_replica",
            "prefix_ttl_s",
            "scrape_lease_ttl_s",
        ):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.max_connections < 2:
            raise ValueError("max_connections must be >= 2 (pub/sub holds one)")
        if (
            self.lease_ttl_s <= 2 * max(self.inflight_poll_s, self.inflight_idle_poll_s)
            or self.lease_ttl_s <= self.flush_interval_s
        ):
            raise ValueError(
                "lease_ttl_s must exceed 2 x inflight_poll_s, 2 x inflight_idle_poll_s"
                " and flush_interval_s"
            )
        if self.scrape_lease_ttl_s <= 2 * max(self.inflight_poll_s, self.inflight_idle_poll_s):
            # Leases are renewed on the in-flight poll: it must come twice within one.
            raise ValueError(
                "scrape_lease_ttl_s must exceed 2 x inflight_poll_s and 2 x inflight_idle_poll_s"
            )
        if self.late_grace_s < 0:
            raise ValueError(f"late_grace_s must be >= 0, got {self.late_grace_s}")
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")

    @property
    def enabled(self) -> bool:
        return bool(self.url)
