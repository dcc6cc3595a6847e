"""The shared state component: one Redis connection pool per process and its background loops.

Nothing on a request's routing path reads Redis. Each process publishes its routing outcomes
(batched, pipelined) and applies the others' to its own cache index (`mirror.py`), and the
prefixes of its requests in flight from the pick on (`inflight.py`); its in-flight counts
ride the flush too, and a lease (a hash with a TTL) rewritten and read every
`inflight_idle_poll_s` heals them and drops a dead process's (`counts.py`).
While Redis is down or slow every process routes from what it holds; one log line says so,
one says when sharing is back (re-subscribed, leases rewritten, tier-1 state re-read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.proxy.affinity import Affinity
from gateway.replicas.outlier import Ejection
from gateway.replicas.pool import ReplicaPool
from gateway.shared_state import bootstrap, writes
from gateway.shared_state.config import SharedStateConfig
from gateway.shared_state.counts import LocalCounts, RemoteCounts
from gateway.shared_state.inbox import Inbox
from gateway.shared_state.inflight import SharedInflight
from gateway.shared_state.link import (
    FAILURES,
    TIMEOUTS,
    Lateness,
    SharedStats,
    default_process_id,
    reraise_cancel,
)
from gateway.shared_state.mirror import Mirror
from gateway.shared_state.picks import SharedPicks
from gateway.shared_state.scrapes import ScrapeLeases
from gateway.shared_state.scripts import ALL, Keys
from routing.types import RequestFeatures

log = logging.getLogger("llm_gateway.shared_state")


class SharedState:
    """Shares tier-1, prefix history, in-flight load and quota slots through one Redis."""

    def __init__(
        self,
        cfg: SharedStateConfig,
        affinity: Affinity,
        pool: ReplicaPool,
        process_id: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.keys = Keys(cfg.key_prefix)
        self.process_id = process_id or default_process_id()
        self.affinity = affinity
        self.pool = pool
        self.mirror = Mirror(affinity, pool)
        self.stats = SharedStats()
        self._lateness = Lateness(cfg.late_grace_s)
        # One /metrics scraper per replica for every process (None: each scrapes its own).
        self.scrapes: ScrapeLeases | None = None
        if cfg.share_scrapes:
            self.scrapes = ScrapeLeases(cfg, self.keys, self.process_id, pool, self._wake)
        self.up = False
        # The others follow this process's new prefixes from its pick, as it does itself.
        self.inflight = SharedInflight(
            affinity.inflight.max_requests, cfg.lease_ttl_s, cfg.max_event_blocks, self._wake
        )
        affinity.inflight = self.inflight
        self.picks = SharedPicks(cfg.max_pending, lambda: self.up, self._wake)
        self.counts = LocalCounts(pool, self._wake)
        self.remote = RemoteCounts(pool, cfg.lease_ttl_s)
        pool.on_in_flight = self.counts.changed
        self.inbox = Inbox(
            self.process_id, self.mirror, self.inflight, self.remote, pool, self.scrapes, self.picks
        )
        self._pending: deque[tuple[float, RequestFeatures, str]] = deque(maxlen=cfg.max_pending)
        self._settles: deque[writes.Settle] = deque(maxlen=cfg.max_pending)
        self._ejections: deque[Ejection] = deque(maxlen=cfg.max_pending)
        self._has_pending = asyncio.Event()
        self._up = asyncio.Event()
        self._subscribed = asyncio.Event()
        self._down = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # Set before the loops are cancelled: a client library that turns a cancellation into
        # an error it retries must not keep a stopped loop (and its lease) alive.
        self._stopping = False
        # Tenant -> quota slots this process holds in Redis (set by the Redis quota store).
        self.quota_held: Callable[[], Mapping[str, int]] = dict
        self.redis = Redis(
            connection_pool=BlockingConnectionPool.from_url(
                cfg.url,
                max_connections=cfg.max_connections,
                timeout=cfg.batch_timeout_s,
                socket_timeout=cfg.batch_timeout_s,
                socket_connect_timeout=cfg.connect_timeout_s,
                # Fail fast: the loops retry on their own schedule, a request never waits.
                retry=Retry(NoBackoff(), 0),
            ),
        )

    # --- the hot path's part: one append -------------------------------------------------

    def on_record(self, features: RequestFeatures, replica: str) -> None:
        """Affinity.record's hook: queue the outcome; encoding happens in the flush."""
        pending = self._pending
        if len(pending) == pending.maxlen:
            self.stats.dropped += 1
        pending.append((time.time(), features, replica))
        if not self._has_pending.is_set():
            self._has_pending.set()

    def _wake(self) -> None:
        if self.up and not self._has_pending.is_set():
            self._has_pending.set()

    def queue_ejection(self, ejection: Ejection) -> None:
        """The pool's hook: this process ejected a replica; the others eject it too."""
        if self.up:
            self._ejections.append(ejection)
            self._has_pending.set()

    def queue_settle(self, settle: writes.Settle) -> None:
        """A quota settle for the next flush (dropped while Redis is down: leases heal it)."""
        if self.up:
            self._settles.append(settle)
            if not self._has_pending.is_set():
                self._has_pending.set()

    # --- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect once (a failure is logged, not fatal) and start the loops."""
        self._tasks = [
            asyncio.create_task(self._flusher(), name="shared-state-flush"),
            asyncio.create_task(self._poller(), name="shared-state-inflight"),
            asyncio.create_task(self._subscriber(), name="shared-state-subscribe"),
        ]
        await self._connect()
        if not self.up:
            self._mark_down("start", None)
        self._tasks.append(asyncio.create_task(self._connector(), name="shared-state-connect"))

    async def stop(self) -> None:
        """Stop the loops, drop this process's lease (the others stop counting it), close."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # Bounded: a loop stuck in a client call must not hold the gateway's shutdown.
            await asyncio.wait(self._tasks, timeout=4 * self.cfg.batch_timeout_s)
        self._tasks = []
        if self.up:
            with contextlib.suppress(*FAILURES):
                async with asyncio.timeout(self.cfg.batch_timeout_s):
                    pipe = self.redis.pipeline(transaction=False)
                    writes.queue_goodbye(pipe, self.keys, self.process_id, self.counts.version)
                    if self.scrapes is not None:
                        self.scrapes.queue_release(pipe)
                    await pipe.execute()
        self.up = False
        with contextlib.suppress(*FAILURES):
            async with asyncio.timeout(self.cfg.batch_timeout_s):
                await self.redis.aclose()
                await self.redis.connection_pool.disconnect()

    def abandon(self) -> None:
        """Stop every loop at once without a word to Redis: a process that died (tests)."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        self.up = self.inflight.sharing = False

    # --- up and down ---------------------------------------------------------------------

    def failed(self, what: str, exc: BaseException) -> None:
        """An operation failed: count it, and go down (one log line) if we were up, unless it
        only timed out within late_grace_s of the last answer."""
        self.stats.failed_ops += 1
        if isinstance(exc, TIMEOUTS) and not self._lateness.late(time.monotonic()):
            self.stats.late_ops += 1
        else:
            self._mark_down(what, exc)
        reraise_cancel()

    def answered(self) -> None:
        """A round trip was answered in time: a run of late ones is over."""
        self._lateness.answered()

    def _mark_down(self, what: str, exc: BaseException | None) -> None:
        # Subscribe again once back: the subscription may have died with the connection.
        self._subscribed.clear()
        self._lateness.answered()
        if self._down.is_set():
            return
        was_up = self.up
        self.up = self.inflight.sharing = False
        self.inflight.lost()
        self._up.clear()
        self._down.set()
        self.stats.downs += 1
        self.remote.clear()
        self.counts.lost()
        if self.scrapes is not None:
            self.scrapes.lost()
        detail = f"{type(exc).__name__}: {exc}" if exc is not None else "no connection"
        if was_up or what == "start":
            log.warning(
                "shared state down (%s, %s): routing from this process's state alone"
                " (and scraping every replica itself)",
                what,
                detail,
            )

    async def _connect(self) -> None:
        cfg = self.cfg
        try:
            async with asyncio.timeout(cfg.connect_timeout_s + cfg.batch_timeout_s):
                if self._down.is_set():
                    # Pooled connections may be to a server that is gone: start afresh.
                    await self.redis.connection_pool.disconnect()
                await self.redis.ping()
                pipe = self.redis.pipeline(transaction=False)
                for text in ALL.values():
                    pipe.script_load(text)
                await pipe.execute()
        except FAILURES:
            self.stats.failed_ops += 1
            reraise_cancel()
            return
        recovered = self._down.is_set()
        self.up = self.inflight.sharing = True
        self._down.clear()
        self._up.set()
        try:
            # Subscribed before reading Redis's state: no outcome falls between the two.
            async with asyncio.timeout(4 * cfg.batch_timeout_s):
                await self._subscribed.wait()
        except TimeoutError as exc:
            self.failed("subscribe", exc)
            return
        if recovered:
            log.warning("shared state up again: sharing routing state through Redis")
        else:
            log.info("shared state: process %s shares routing state", self.process_id)
        # The outage may have hidden the others' decisions: read what Redis holds.
        await self._bootstrap()

    async def _connector(self) -> None:
        delay = self.cfg.reconnect_min_s
        while not self._stopping:
            await self._down.wait()
            await asyncio.sleep(delay)
            await self._connect()
            delay = (
                self.cfg.reconnect_min_s if self.up else min(2 * delay, self.cfg.reconnect_max_s)
            )

    async def _bootstrap(self) -> None:
        try:
            async with asyncio.timeout(10 * self.cfg.batch_timeout_s):
                await bootstrap.load(self.redis, self.keys, self.mirror, list(self.pool.replicas))
        except FAILURES as exc:
            self.failed("bootstrap", exc)

    # --- the loops -----------------------------------------------------------------------

    async def _flusher(self) -> None:
        while not self._stopping:
            await self._has_pending.wait()
            # A batch window: the outcomes of a burst go out in one round trip.
            window = self.cfg.flush_interval_s
            if self.counts.dirty:
                window = min(window, self.cfg.inflight_poll_s)
            await asyncio.sleep(window)
            self._has_pending.clear()
            if not self.up:
                await self._up.wait()
            try:
                async with asyncio.timeout(self.cfg.batch_timeout_s):
                    await self._flush()
                self.answered()
            except FAILURES as exc:
                self.counts.lost()  # pushed again with the next flush
                self.failed("flush", exc)
            reraise_cancel()

    async def _flush(self) -> None:
        outcomes = writes.drain_outcomes(self._pending, self.cfg.max_event_blocks)
        settles, ejections = list(self._settles), list(self._ejections)
        self._settles.clear()
        self._ejections.clear()
        scrapes = self.scrapes.drain() if self.scrapes is not None else []
        inflight, picks = self.inflight.drain(), self.picks.drain()
        counts = self.counts.take()
        if not (outcomes or settles or ejections or scrapes or inflight or counts or picks):
            return
        keys, pid = self.keys, self.process_id
        pipe = self.redis.pipeline(transaction=False)
        first = writes.queue_messages(
            pipe, keys, pid, outcomes, ejections, scrapes, inflight, counts, picks
        )
        merges = writes.queue_outcomes(pipe, keys, self.cfg, self.affinity.cfg, outcomes)
        writes.queue_settles(pipe, keys, pid, settles)
        results = await pipe.execute()
        for applied_rejected in results[first : first + merges]:
            self.stats.rejected_stale += int(applied_rejected[1])
        self.stats.published += len(outcomes)
        if self.inflight.pending or self.picks.pending:  # the rest go at once
            self._has_pending.set()

    async def _poller(self) -> None:
        while not self._stopping:
            await self._up.wait()
            try:
                async with asyncio.timeout(self.cfg.batch_timeout_s):
                    await self._beat()
                self.answered()
            except FAILURES as exc:
                self.failed("in-flight", exc)
            reraise_cancel()
            now = time.monotonic()
            self.inflight.expire(now)
            self.remote.expire(now)
            # Busy or not: the counts are pushed, the beat only heals them (counts.py).
            await asyncio.sleep(self.cfg.inflight_idle_poll_s)

    async def _beat(self) -> None:
        """Rewrite this process's lease and read the others' in one script (one round trip);
        a few times per scrape lease TTL the scrape claim rides in the same round trip."""
        keys, pid = self.keys, self.process_id
        lease_ms = int(self.cfg.lease_ttl_s * 1000)
        version, counts = self.counts.snapshot()
        held = dict(self.quota_held())
        now = time.monotonic()
        leases = self.scrapes if self.scrapes is not None and self.scrapes.claim_due(now) else None
        pipe = self.redis.pipeline(transaction=False)
        writes.queue_beat(pipe, keys, pid, lease_ms, version, counts, held)
        if leases is not None:
            leases.queue_claim(pipe)
        results = await pipe.execute()
        if leases is not None:
            leases.claimed(results[1], now)
        self.stats.peers = self.remote.beat(results[0], now, time.monotonic())

    async def _subscriber(self) -> None:
        while not self._stopping:
            await self._up.wait()
            pubsub = self.redis.pubsub()
            wait = self.cfg.batch_timeout_s
            try:
                async with asyncio.timeout(wait):
                    await pubsub.subscribe(self.keys.channel)
                    while (await pubsub.get_message(timeout=wait) or {}).get("type") != "subscribe":
                        pass
                self._subscribed.set()
                while self._subscribed.is_set():
                    msg = await pubsub.get_message(timeout=wait)
                    if msg is not None and msg["type"] == "message":
                        self.inbox.apply(msg["data"])
            except FAILURES as exc:
                self.failed("subscribe", exc)
            finally:
                with contextlib.suppress(*FAILURES):
                    async with asyncio.timeout(self.cfg.batch_timeout_s):
                        await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed in redis 8

    def stats_row(self) -> dict[str, float]:
        """Gauges and counters for the metrics."""
        s, m = self.stats, self.mirror.stats
        return {
            "up": 1.0 if self.up else 0.0,
            "failed_ops": s.failed_ops,
            "late_ops": s.late_ops,
            "published": s.published,
            "applied": m.applied,
            "stale_local": m.stale,
            "rejected_stale": s.rejected_stale,
            "peers": s.peers,
            "inflight_remote": self.inflight.remote_count(),
            "inflight_told": self.inflight.told,
            "inflight_applied": self.inflight.applied,
            "picks_told": self.picks.told,
            "picks_applied": self.picks.applied,
            **(self.scrapes.row() if self.scrapes is not None else {}),
        }
