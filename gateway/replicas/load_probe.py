"""Per-replica /load probe: load that reached a replica some other way, between scrapes.

vLLM started with --enable-server-load-tracking answers GET /load with {"server_load": N}, the
generation and pooling requests its API server holds, for a fraction of what a /metrics render
costs it (benchmarks/results/2026-12-05-load-probe). N beyond every gateway process's own
requests there is load from other clients (or gateways that share no state): it reaches the
replica's snapshot within two reads instead of at the next scrape.

Without the flag vLLM 0.32 still serves /load, always {"server_load": 0}; a build without the
route answers 404. Either way the replica is probed no further, and asked again rarely.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import aiohttp
import orjson

from gateway.config import ScoreLoopConfig
from gateway.replicas.cadence import NEVER
from gateway.replicas.state import ReplicaState

log = logging.getLogger("llm_gateway.load_probe")

# A replica without load tracking is asked again this rarely (and after a health flap: a
# restart may have turned it on).
RETRY_S = 60.0
# Reads of 0 while this process had requests there the whole time, before concluding the
# replica runs without load tracking: vLLM counts a request from its arrival to its last byte,
# so one of ours in flight across a read shows, but for one still on the wire or draining.
UNTRACKED_READS = 8


@dataclass(frozen=True, slots=True)
class Reading:
    """One /load answer, and every gateway process's own count around it."""

    server_load: int
    # The larger of the counts when the read was sent and when it came back: a request of
    # ours vLLM may count must not look foreign.
    ours: int

    @property
    def excess(self) -> int:
        """Requests vLLM holds beyond ours."""
        return max(0, self.server_load - self.ours)


def foreign(prev: Reading | None, last: Reading) -> int:
    """Foreign load both reads agree on: our counts and vLLM's move at different instants
    (a request just sent may not be counted yet, one just ended may still be)."""
    if prev is None:
        return 0
    return min(prev.excess, last.excess)


def server_load(body: bytes) -> int | None:
    """The count in a /load answer; None when the body has none (not vLLM's /load)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    load = doc.get("server_load") if isinstance(doc, dict) else None
    if isinstance(load, bool) or not isinstance(load, int) or load < 0:
        return None
    return load


@dataclass(slots=True)
class _Probe:
    """The probe's record of one replica."""

    # Acquisitions ever (finished + in flight), to tell when a request was last routed here.
    acquired: int
    last_read: float = NEVER
    prev: Reading | None = None
    # Consecutive reads of 0 while this process had requests there (see UNTRACKED_READS).
    zeros: int = 0
    # Not probed before this (load tracking off); `down_since_off`: a health flap since.
    off_until: float = NEVER
    down_since_off: bool = False
    told_off: bool = False


def _ours(replica: ReplicaState) -> int:
    return replica.in_flight + replica.remote_in_flight


class LoadProbe:
    """One task per replica; each read updates that replica's foreign_in_flight only."""

    def __init__(self, cfg: ScoreLoopConfig, session: aiohttp.ClientSession) -> None:
        self._cfg = cfg
        self._session = session
        self._probes: dict[str, _Probe] = {}
        # When a request was last routed to any replica: each decision compares them all, so
        # while the gateway routes, an idle replica's count matters as much as a busy one's.
        self._routed_at = NEVER

    @property
    def enabled(self) -> bool:
        return self._cfg.load_interval_s > 0

    def untracked(self, name: str) -> bool:
        """Whether the replica is left unprobed now, its load tracking found off."""
        probe = self._probes.get(name)
        return probe is not None and probe.off_until > time.monotonic()

    def _probe(self, replica: ReplicaState) -> _Probe:
        probe = self._probes.get(replica.name)
        if probe is None:
            # From none: a request routed before this replica's first look still counts.
            probe = self._probes[replica.name] = _Probe(0)
        return probe

    def interval(self, replica: ReplicaState, now: float) -> float:
        """Seconds between reads: fast while the replica has work or the gateway routed lately."""
        probe = self._probe(replica)
        acquired = replica.requests_total + replica.in_flight
        if acquired != probe.acquired:
            probe.acquired, self._routed_at = acquired, now
        cfg = self._cfg
        m = replica.metrics
        busy = (
            _ours(replica) > 0
            or (probe.prev is not None and probe.prev.server_load > 0)
            or (m is not None and (m.running or 0.0) + (m.waiting or 0.0) > 0)
            or now - self._routed_at < cfg.idle_scrape_interval_s
        )
        return cfg.load_interval_s if busy else max(cfg.load_interval_s, cfg.idle_scrape_interval_s)

    def _off(self, replica: ReplicaState, probe: _Probe, now: float, why: str) -> None:
        probe.off_until, probe.down_since_off = now + RETRY_S, False
        probe.prev, probe.zeros = None, 0
        replica.foreign_in_flight = 0
        if not probe.told_off:
            probe.told_off = True
            log.info("replica %s: %s; not probing its /load for %.0f s", replica.name, why, RETRY_S)

    def _lost(self, replica: ReplicaState, probe: _Probe) -> None:
        # Agreement needs two reads in a row: a failed one breaks the chain, and a count no
        # read backs any more must not hold the replica's load up.
        probe.prev = None
        replica.foreign_in_flight = 0

    async def read(self, replica: ReplicaState) -> Reading | None:
        """One /load read, applied to the replica's state; None when it gave no count."""
        probe = self._probe(replica)
        before, own_before = _ours(replica), replica.in_flight
        replica.load_probes_total += 1
        probe.last_read = time.monotonic()
        try:
            async with (
                asyncio.timeout(self._cfg.load_timeout_s),
                self._session.get(replica.config.url + "/load") as resp,
            ):
                status = resp.status
                body = await resp.read() if status == 200 else b""
        except (aiohttp.ClientError, ConnectionError, TimeoutError):
            self._lost(replica, probe)
            return None
        now = time.monotonic()
        if status == 404:
            self._off(replica, probe, now, "GET /load answers 404")
            return None
        load = server_load(body) if status == 200 else None
        if load is None:
            if status == 200:
                self._off(replica, probe, now, "its /load answer has no server_load")
            else:
                self._lost(replica, probe)
            return None
        if load == 0 and min(own_before, replica.in_flight) > 0:
            probe.zeros += 1
            if probe.zeros >= UNTRACKED_READS:
                why = "/load counts none of our requests (no --enable-server-load-tracking?)"
                self._off(replica, probe, now, why)
                return None
        elif load > 0:
            probe.zeros, probe.told_off = 0, False
        reading = Reading(load, max(before, _ours(replica)))
        replica.foreign_in_flight = foreign(probe.prev, reading)
        probe.prev = reading
        return reading

    def _retry_due(self, replica: ReplicaState, probe: _Probe, now: float) -> bool:
        if now >= probe.off_until:
            return True
        if replica.probe_down:
            probe.down_since_off = True
            return False
        # Down and up again since it was found untracked: it may run with other flags now.
        return probe.down_since_off

    async def run(self, replica: ReplicaState) -> None:
        """Read whenever due, forever (cancelled by the owner)."""
        fastest = self._cfg.load_interval_s
        # Afresh: a replica removed and added again under its name is a new one.
        record = self._probes[replica.name] = _Probe(0)
        try:
            await self._loop(replica, fastest)
        finally:
            # Removed (its task cancelled) or stopping: the record goes with the task, unless
            # the name was added again meanwhile and a newer task holds its own.
            if self._probes.get(replica.name) is record:
                del self._probes[replica.name]

    async def _loop(self, replica: ReplicaState, fastest: float) -> None:
        while True:
            now = time.monotonic()
            probe = self._probe(replica)
            interval = self.interval(replica, now)
            if probe.off_until > NEVER and not self._retry_due(replica, probe, now):
                await asyncio.sleep(fastest)
                continue
            if replica.probe_down:
                self._lost(replica, probe)  # health checks hold it down: no load to follow
                await asyncio.sleep(fastest)
                continue
            due = probe.last_read + interval
            if due <= now:
                probe.off_until = NEVER
                await self.read(replica)
                continue
            # Awake at the fastest cadence: a request routed anywhere brings the next read forward.
            await asyncio.sleep(min(due - now, fastest))
