"""One /metrics scraper per replica across every gateway process and host, through Redis.

A scrape costs the replica's API server CPU (docs/vllm-cpu.md): processes that each scrape
every replica multiply it. Here each replica has a scrape lease in Redis (its owner's process
id, `scrape_lease_ttl_s`), claimed and renewed on the in-flight poll (scripts.CLAIM rides in
the beat's round trip); a process takes at most its fair share, so ownership spreads. The
owner scrapes at the cadence and budget of a process alone and publishes what it read with
the next flush (the message's "s"); every other process applies it as if it had scraped
(ScoreLoop.apply_remote: its own in-flight count the baseline, older versions dropped).
Until a claim is answered, while Redis is down, or once this process's claims are a TTL old,
every process scrapes each replica on its own, with the per-host split of the budget.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio.client import Pipeline

from gateway.replicas.pool import ReplicaPool
from gateway.replicas.state import ReplicaState
from gateway.shared_state.config import SharedStateConfig
from gateway.shared_state.scripts import SHAS, Keys
from vllm_api.metrics import VllmMetrics

log = logging.getLogger("llm_gateway.shared_state")

# Claims per lease TTL: a claim lost to a slow round trip or a busy event loop leaves the
# lease alive for the next ones.
_CLAIMS_PER_TTL = 4
# Told a result that another process read: (replica, version µs, planned interval, figures);
# True when applied, False when older than what the replica's state holds.
OnResult = Callable[[ReplicaState, int, float, VllmMetrics], bool]

_NUMBERS = ("running", "waiting", "kv_usage", "prefix_queries", "prefix_hits", "preemptions")


def _number(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise ValueError(f"not a finite number: {raw!r}")
    return float(raw)


def _optional(raw: Any) -> float | None:
    return None if raw is None else _number(raw)


def _count(raw: Any) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"not an integer: {raw!r}")
    return raw


def _buckets_wire(buckets: dict[float, float]) -> list[list[Any]]:
    # `le` as text: +Inf is no JSON number.
    return [[repr(le), count] for le, count in buckets.items()]


def _buckets_of(raw: Any) -> dict[float, float]:
    if not isinstance(raw, list):
        raise ValueError("buckets must be a list")
    out: dict[float, float] = {}
    for pair in raw:
        match pair:
            case [str(le), count]:
                edge = float(le)
                if math.isnan(edge):
                    raise ValueError("a bucket edge is NaN")
                out[edge] = _number(count)
            case _:
                raise ValueError(f"malformed bucket {pair!r}")
    return out


def metrics_wire(m: VllmMetrics) -> list[Any]:
    """What the score loop reads off one scrape, as JSON-ready values (not the 56 KB text)."""
    return [
        *(getattr(m, name) for name in _NUMBERS),
        m.requests_ok,
        m.requests_failed,
        m.block_size,
        m.num_gpu_blocks,
        sorted(m.running_adapters),
        _buckets_wire(m.ttft_buckets),
        _buckets_wire(m.itl_buckets),
    ]


def metrics_of(raw: Any) -> VllmMetrics:
    """The inverse of metrics_wire; ValueError when `raw` is not one."""
    if not isinstance(raw, list) or len(raw) != len(_NUMBERS) + 7:
        raise ValueError("not a scrape's figures")
    n = len(_NUMBERS)
    adapters = raw[n + 4]
    if not isinstance(adapters, list) or not all(isinstance(a, str) for a in adapters):
        raise ValueError("adapters must be a list of names")
    numbers = {name: _optional(x) for name, x in zip(_NUMBERS, raw[:n], strict=True)}
    return VllmMetrics(
        **numbers,
        requests_ok=_number(raw[n]),
        requests_failed=_number(raw[n + 1]),
        block_size=_count(raw[n + 2]),
        num_gpu_blocks=_count(raw[n + 3]),
        running_adapters=frozenset(adapters),
        ttft_buckets=_buckets_of(raw[n + 5]),
        itl_buckets=_buckets_of(raw[n + 6]),
    )


def result_of(raw: Any) -> tuple[str, int, float, VllmMetrics]:
    """(replica, version µs, planned interval s, figures) of one published result."""
    match raw:
        case [str(replica), int(version), float(interval) | int(interval), figures] if (
            not isinstance(version, bool) and math.isfinite(interval) and interval >= 0
        ):
            return replica, version, float(interval), metrics_of(figures)
    raise ValueError("malformed scrape result")


def preference(process_id: str, replicas: Iterable[str]) -> list[str]:
    """Replicas in this process's order of preference (rendezvous hashing): processes prefer
    different ones, so their claims rarely meet and a release goes where the others want it."""

    def rank(name: str) -> bytes:
        return hashlib.blake2b(f"{process_id}\0{name}".encode(), digest_size=8).digest()

    return sorted(replicas, key=rank)


@dataclass(slots=True)
class ScrapeStats:
    """What the scrape leases did (read by the metrics and the tests)."""

    claims: int = 0
    published: int = 0
    applied: int = 0
    # Older than what the replica's state held (a later scrape is known here): not applied.
    stale: int = 0
    malformed: int = 0
    unknown_replica: int = 0


class ScrapeLeases:
    """This process's scrape leases: the score loop asks which replicas it scrapes."""

    def __init__(
        self,
        cfg: SharedStateConfig,
        keys: Keys,
        process_id: str,
        pool: ReplicaPool,
        wake: Callable[[], None],
    ) -> None:
        self._keys = keys
        self._pid = process_id
        self._pool = pool
        # Sets the flusher going: a result waits at most one flush window.
        self._wake = wake
        self._ttl_s = cfg.scrape_lease_ttl_s
        # A few claims per TTL, and one per idle poll at least: a released lease (its owner
        # stopped, or a process joined) is taken at once, whatever the TTL.
        self._claim_every_s = min(
            cfg.scrape_lease_ttl_s / _CLAIMS_PER_TTL, cfg.inflight_idle_poll_s
        )
        self.owned: frozenset[str] = frozenset()
        # Until then the claims last answered hold in Redis (counted from the claim's send).
        self._valid_until = -math.inf
        self._claimed_at = -math.inf
        self._order_of: tuple[str, ...] = ()
        self._order: list[str] = []
        # Replica -> its newest result not yet published (only the newest matters).
        self._pending: dict[str, list[Any]] = {}
        self.on_result: OnResult = lambda _r, _v, _i, _m: False
        self.stats = ScrapeStats()

    # --- the score loop's side (gateway.replicas.score_loop.ScrapeShare) -----------------

    def sharing(self, now: float) -> bool:
        """Whether one process scrapes each replica for all now (the budget is whole)."""
        return now < self._valid_until

    def scrapes(self, replica: str, now: float) -> bool:
        """Whether this process scrapes `replica` now: its owner, or nobody shares."""
        return replica in self.owned or not self.sharing(now)

    def publish(self, replica: str, version_us: int, interval_s: float, m: VllmMetrics) -> None:
        """A scrape this process made, for the others (while sharing; dropped otherwise)."""
        if not self.sharing(time.monotonic()):
            return
        interval = interval_s if math.isfinite(interval_s) else 0.0
        self._pending[replica] = [replica, version_us, interval, metrics_wire(m)]
        self._wake()

    # --- the shared state's side ---------------------------------------------------------

    def row(self) -> dict[str, float]:
        """Gauges and counters for the shared state's metrics row."""
        t = self.stats
        return {
            "scrape_leases": len(self.owned) if self.sharing(time.monotonic()) else 0,
            "scrapes_published": t.published,
            "scrapes_applied": t.applied,
            "scrapes_stale": t.stale,
        }

    def claim_due(self, now: float) -> bool:
        """Whether this beat should carry a claim (a few per lease TTL)."""
        return now - self._claimed_at >= self._claim_every_s

    def _preferred(self) -> list[str]:
        names = tuple(self._pool.replicas)
        if names != self._order_of:
            self._order_of, self._order = names, preference(self._pid, names)
        return self._order

    def queue_claim(self, pipe: Pipeline) -> None:
        """The claim, in the beat's pipeline: no round trip of its own."""
        pipe.evalsha(
            SHAS["claim"],
            1,
            self._keys.scrapers,
            self._pid,
            int(self._ttl_s * 1000),
            self._keys.scrape_base,
            *self._preferred(),
        )

    def queue_release(self, pipe: Pipeline) -> None:
        """Give every lease up (a stopping process): the others take them at their next claim."""
        pipe.evalsha(
            SHAS["release"], 1, self._keys.scrapers, self._pid, self._keys.scrape_base,
            *self._pool.replicas,
        )  # fmt: skip

    def claimed(self, held: Sequence[bytes], sent_at: float) -> None:
        """Redis's answer to a claim sent at `sent_at` (monotonic): the replicas held now."""
        owned = frozenset(name.decode() for name in held)
        self.stats.claims += 1
        if owned != self.owned:
            log.info(
                "scrape leases: this process scrapes %d of %d replicas for every process (%s)",
                len(owned),
                len(self._pool.replicas),
                ", ".join(sorted(owned)) or "none",
            )
        self.owned = owned
        self._claimed_at = sent_at
        self._valid_until = sent_at + self._ttl_s

    def lost(self) -> None:
        """Redis is unreachable: once the last claim's TTL has passed, every replica is scraped
        here again, at the per-host split.

        Until then the leases it granted still stand in Redis, so every process keeps to them:
        a round trip that was only late (a busy host) does not send every process scraping
        every replica at once.
        """
        self._pending.clear()

    def drain(self) -> list[list[Any]]:
        """The results to publish with this flush."""
        out = list(self._pending.values())
        self._pending.clear()
        self.stats.published += len(out)
        return out

    def apply(self, raws: Iterable[Any]) -> None:
        """Another process's published results, into the replicas' states unless older."""
        stats, replicas = self.stats, self._pool.replicas
        for raw in raws:
            try:
                name, version, interval, figures = result_of(raw)
            except ValueError:
                stats.malformed += 1
                continue
            replica = replicas.get(name)
            if replica is None:
                stats.unknown_replica += 1
            elif self.on_result(replica, version, interval, figures):
                stats.applied += 1
            else:
                stats.stale += 1
