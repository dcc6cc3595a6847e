"""Per-replica score loop: scrape /metrics at an adaptive cadence, keep windowed latencies.

With several gateway processes sharing state, one of them scrapes each replica for all
(ScrapeShare: gateway/shared_state/scrapes.py) and the others apply what it read as if they
had scraped (apply_remote).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from gateway.config import ScoreLoopConfig
from gateway.replicas.cadence import NEVER, Bounds, Budget, Observation, due_at, next_interval
from gateway.replicas.state import ReplicaState
from vllm_api.metrics import VllmMetrics, parse_vllm_metrics, quantile_from_deltas

log = logging.getLogger("llm_gateway.score_loop")


def restarted(old: VllmMetrics, new: VllmMetrics) -> bool:
    """Whether a cumulative counter went backwards between two scrapes: a new vLLM process."""
    pairs = [(old.requests_ok, new.requests_ok), (old.requests_failed, new.requests_failed)]
    for before, now in (
        (old.prefix_queries, new.prefix_queries),
        (old.preemptions, new.preemptions),
    ):
        if before is not None and now is not None:
            pairs.append((before, now))
    return any(now < before for before, now in pairs)


class ScrapeShare(Protocol):
    """Who scrapes which replica when gateway processes share state (shared_state/scrapes.py)."""

    def sharing(self, now: float) -> bool:
        """Whether one process scrapes each replica for all now (the budget is whole)."""
        ...

    def scrapes(self, replica: str, now: float) -> bool:
        """Whether this process scrapes `replica` now."""
        ...

    def publish(self, replica: str, version_us: int, interval_s: float, m: VllmMetrics) -> None:
        """A good scrape this process made, for the others."""
        ...


class Alone:
    """No sharing: this process scrapes every replica, its host's share of the budget."""

    def sharing(self, now: float) -> bool:
        return False

    def scrapes(self, replica: str, now: float) -> bool:
        return True

    def publish(self, replica: str, version_us: int, interval_s: float, m: VllmMetrics) -> None:
        return None


@dataclass(slots=True)
class _Pace:
    """The score loop's own record of one replica's cadence (cadence.py decides from it)."""

    budget: Budget
    # Acquisitions ever (finished + in flight), to tell when a request was last routed here.
    acquired: int
    routed_at: float = NEVER
    last_attempt: float = NEVER
    prev: Observation | None = None
    last: Observation | None = None
    # The interval that led to `last`, and the one planned from it (only ever shortened
    # between two scrapes, so the freshness promised by ReplicaState.scrape_interval_s holds).
    previous_s: float = 0.0
    interval_s: float = 0.0


class ScoreLoop:
    """One task per replica; each scrape updates that replica's ReplicaState in place."""

    def __init__(
        self,
        cfg: ScoreLoopConfig,
        session: aiohttp.ClientSession,
        on_capacity: Callable[[str, int], None],
        on_scrape: Callable[[], None] = lambda: None,
        on_restart: Callable[[str], None] = lambda _name: None,
        on_preemptions: Callable[[str, float], None] = lambda _name, _count: None,
        workers: int = 1,
        share: ScrapeShare | None = None,
    ) -> None:
        # Told each rise of a replica's preemption counter between two scrapes (the outlier
        # policy ejects on a jump).
        self._on_preemptions = on_preemptions
        # Told of a replica that restarted: its KV cache is gone, whatever the tiers remember.
        self._on_restart = on_restart
        # Each fresh view of a replica may show room for a request the admission queue holds.
        self._on_scrape = on_scrape
        self._cfg = cfg
        # Told each replica's KV capacity in blocks (vllm:cache_config_info) when it changes.
        self._on_capacity = on_capacity
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=cfg.scrape_timeout_s)
        self._history: dict[str, deque[tuple[float, VllmMetrics]]] = {}
        # `workers` gateway processes on this host scrape the same replicas: each takes its
        # share, unless one process scrapes each replica for all (the budget is whole then).
        self._split = Bounds.of(cfg, workers)
        self._whole = Bounds.of(cfg, 1)
        self._share: ScrapeShare = share or Alone()
        self._paces: dict[str, _Pace] = {}
        # Wall-clock µs of the figures each replica's state holds: older ones never replace them.
        self._versions: dict[str, int] = {}

    @property
    def _bounds(self) -> Bounds:
        return self._whole if self._share.sharing(time.monotonic()) else self._split

    def _pace(self, replica: ReplicaState, now: float) -> _Pace:
        pace = self._paces.get(replica.name)
        if pace is None:
            acquired = replica.requests_total + replica.in_flight
            pace = self._paces[replica.name] = _Pace(Budget.full(self._bounds, now), acquired)
        return pace

    async def scrape(self, replica: ReplicaState) -> bool:
        """One scrape; False (and the old values kept, ageing) when it fails."""
        now = time.monotonic()
        pace = self._pace(replica, now)
        # Failed attempts count: a stalled replica is a busy one.
        pace.last_attempt, pace.budget = now, pace.budget.spend(self._bounds, now)
        replica.scrapes_total += 1
        try:
            async with self._session.get(
                replica.config.url + "/metrics", timeout=self._timeout
            ) as resp:
                if resp.status != 200:
                    replica.scrape_errors += 1
                    return False
                text = await resp.text()
        except (aiohttp.ClientError, ConnectionError, TimeoutError, UnicodeDecodeError):
            replica.scrape_errors += 1
            return False
        m = parse_vllm_metrics(text)
        version = int(time.time() * 1e6)
        self._versions[replica.name] = version
        self.record(replica, m, time.monotonic())
        self._share.publish(replica.name, version, replica.scrape_interval_s, m)
        self._on_scrape()
        return True

    def apply_remote(
        self, replica: ReplicaState, version_us: int, interval_s: float, m: VllmMetrics
    ) -> bool:
        """Another process's scrape, as if this one had made it now; False when older than
        what the replica's state holds. Its next one is due when the scraper planned it."""
        if version_us <= self._versions.get(replica.name, -1):
            return False
        self._versions[replica.name] = version_us
        now = time.monotonic()
        pace = self._pace(replica, now)
        # The budget spent as the scraper's was: one that takes over goes on from its level.
        pace.last_attempt, pace.budget = now, pace.budget.spend(self._bounds, now)
        self.record(replica, m, now)
        if interval_s > 0:
            pace.interval_s = replica.scrape_interval_s = interval_s
        self._on_scrape()
        return True

    def record(self, replica: ReplicaState, m: VllmMetrics, now: float) -> None:
        """A good scrape: into the replica's state, and the next one planned from it."""
        self._apply(replica, m, now)
        pace = self._pace(replica, now)
        pace.prev = pace.last
        pace.last = Observation(now, m.running, m.waiting, m.kv_usage, _ours(replica))
        pace.previous_s = pace.interval_s
        pace.interval_s = math.inf  # planned afresh by due()
        replica.scrape_interval_s = math.inf
        self.due(replica, now)

    def _routed(self, replica: ReplicaState, now: float) -> _Pace:
        pace = self._pace(replica, now)
        acquired = replica.requests_total + replica.in_flight
        if acquired != pace.acquired:
            pace.acquired, pace.routed_at = acquired, now
        return pace

    def due(self, replica: ReplicaState, now: float) -> float:
        """When this replica's next scrape starts; re-planned on each call (cheap, no I/O)."""
        pace = self._routed(replica, now)
        last = pace.last
        if last is None:  # never scraped, or restarted: as soon as the bounds allow
            return due_at(self._bounds, now, 0.0, pace.budget, pace.last_attempt, now)
        bounds = self._bounds
        interval = next_interval(
            bounds, pace.prev, last, pace.previous_s, _ours(replica), now - pace.routed_at
        )
        pace.interval_s = min(pace.interval_s, interval)
        due = due_at(bounds, last.at, pace.interval_s, pace.budget, pace.last_attempt, now)
        # What freshness counts lateness from: brought forward between scrapes, never before
        # now (the values were good until we wanted new ones), never pushed back.
        replica.scrape_interval_s = min(replica.scrape_interval_s, max(due, now) - last.at)
        return due

    def _apply(self, replica: ReplicaState, m: VllmMetrics, now: float) -> None:
        old = replica.metrics
        # Failed scrapes keep the last good one, so a restart behind a down period shows too.
        if old is not None and restarted(old, m):
            log.info(
                "replica %s restarted (its counters went back): forgetting what it cached",
                replica.name,
            )
            # Latency windows must not span two processes (their deltas would go negative).
            self._history.pop(replica.name, None)
            pace = self._paces.get(replica.name)
            if pace is not None:
                pace.last = None  # its dynamics start afresh too
            self._on_restart(replica.name)
            old = None  # and its cache size is told again, to the emptied index
        if old is not None and old.preemptions is not None and m.preemptions is not None:
            # Within one process only: a restart's counter starts afresh (old is None then).
            jump = m.preemptions - old.preemptions
            if jump > 0:
                self._on_preemptions(replica.name, jump)
        if m.num_gpu_blocks and (old is None or old.num_gpu_blocks != m.num_gpu_blocks):
            self._on_capacity(replica.name, m.num_gpu_blocks)
        replica.metrics = m
        replica.scraped_at = now
        # Load between scrapes = scraped + the gateway's own changes since (see snapshot()).
        replica.in_flight_at_scrape = replica.in_flight
        # foreign_in_flight stays: it feeds the snapshot's in_flight, never running/waiting,
        # and the router takes the larger of in_flight and the scraped load (routing.scoring
        # .load), so a foreign request both show counts once; cleared, it would hide until
        # two more /load reads what the scrape itself just confirmed.
        if m.running_adapters or replica.loaded_adapters:
            replica.loaded_adapters = m.running_adapters
        history = self._history.setdefault(replica.name, deque())
        history.append((now, m))
        while len(history) > 2 and now - history[0][0] > self._cfg.latency_window_s:
            history.popleft()
        _, oldest = history[0]
        if oldest is m:
            return
        replica.ttft_p50_s = quantile_from_deltas(m.ttft_buckets, oldest.ttft_buckets, 0.5)
        replica.ttft_p99_s = quantile_from_deltas(m.ttft_buckets, oldest.ttft_buckets, 0.99)
        replica.itl_p99_s = quantile_from_deltas(m.itl_buckets, oldest.itl_buckets, 0.99)
        ok = m.requests_ok - oldest.requests_ok
        failed = m.requests_failed - oldest.requests_failed
        replica.error_rate = failed / (ok + failed) if ok + failed > 0 else None

    async def run(self, replica: ReplicaState) -> None:
        """Scrape whenever due() says, forever (cancelled by the owner)."""
        while True:
            now = time.monotonic()
            if not self._share.scrapes(replica.name, now):
                # Another process scrapes it for all: its results arrive by apply_remote, and
                # the plan they carry is what freshness counts from.
                self._routed(replica, now)
                await asyncio.sleep(self._bounds.fastest_s)
                continue
            due = self.due(replica, now)
            if due <= now:
                await self.scrape(replica)
                continue
            # Awake at the fastest cadence: a burst routed here brings the next scrape forward.
            await asyncio.sleep(min(due - now, self._bounds.fastest_s))


def _ours(replica: ReplicaState) -> int:
    # Every gateway process's requests (the others' as of the last in-flight poll): another
    # process's burst is the gateway's own load, no surprise to scrape for; so is another
    # client's that /load already told (load_probe.py).
    return replica.in_flight + replica.remote_in_flight + replica.foreign_in_flight
