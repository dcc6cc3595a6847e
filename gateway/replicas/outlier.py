"""Outlier ejection and the ramp on return: a pure policy over outcomes and a clock it is given.

Passive detectors eject a replica that live traffic finds failing: consecutive failures, a
failure rate over a sliding window, or an out-of-memory / KV-cache error in a 5xx body. An
ejection lasts `base_ejection_s` x n (the replica's n-th ejection, capped at
`max_ejection_s`); n loses one for each `decay_s` without an ejection. A passing health probe
does not end it early. At most `max_ejected_share` of the fleet is ejected at once, but at
least one replica of a fleet of two or more may be (Envoy's max_ejection_percent), and never
the last routable one. Every return (an ejection's end, or a replica coming back up after
failed probes) ramps: the replica is admitted to `ramp_start` of the decisions, x
`ramp_factor` every `ramp_step_s`, until all of them. Admission is a deterministic smooth
counter, never a draw and never keyed on the request.

The score loop adds one signal of its own: a jump in vLLM's preemption counter between two
scrapes over `max_preemptions_per_scrape` ejects at once (a replica recomputing more sequences
than a full batch is thrashing its KV cache), under the same caps.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Set
from dataclasses import dataclass, field, replace

# Float sums of fractions (100 x 0.01) fall a hair short of 1.
_EPSILON = 1e-9
# The failure-rate window is kept in this many buckets: memory bounded at any request rate.
_BUCKETS = 10


@dataclass(frozen=True, slots=True)
class OutlierConfig:
    """[outlier]: passive ejection of failing replicas, and their ramp back to a full share."""

    # Consecutive failed requests (5xx, timeout, transport error) that eject; 0 = off.
    consecutive_failures: int = 3
    # Failed share of the requests in the window that ejects, once the window holds
    # `failure_rate_min_requests`; 0 = off.
    failure_rate: float = 0.05
    failure_rate_window_s: float = 10.0
    failure_rate_min_requests: int = 50
    # A 5xx whose body holds one of these (case-insensitive) ejects at once; () = off.
    oom_patterns: tuple[str, ...] = ("out of memory", "outofmemory", "kv cache")
    # Preemptions between two /metrics scrapes over this eject; 0 = off. 256 is vLLM's
    # default max_num_seqs: the whole batch recomputed within one scrape interval.
    max_preemptions_per_scrape: int = 256
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    # Each this long without an ejection takes one off the replica's ejection count.
    decay_s: float = 60.0
    max_ejected_share: float = 0.5
    # A returning replica's share of decisions: ramp_start, x ramp_factor every ramp_step_s.
    ramp_start: float = 0.01
    ramp_factor: float = 1.5
    ramp_step_s: float = 10.0

    def __post_init__(self) -> None:
        if self.consecutive_failures < 0:
            raise ValueError(f"consecutive_failures must be >= 0, got {self.consecutive_failures}")
        if not 0.0 <= self.failure_rate <= 1.0:
            raise ValueError(f"failure_rate must be in [0, 1], got {self.failure_rate}")
        if self.max_preemptions_per_scrape < 0:
            raise ValueError(
                f"max_preemptions_per_scrape must be >= 0, got {self.max_preemptions_per_scrape}"
            )
        if self.failure_rate_min_requests < 1:
            raise ValueError("failure_rate_min_requests must be >= 1")
        for name in ("failure_rate_window_s", "base_ejection_s", "decay_s", "ramp_step_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_ejection_s < self.base_ejection_s:
            raise ValueError("max_ejection_s must be >= base_ejection_s")
        if not 0.0 <= self.max_ejected_share <= 1.0:
            raise ValueError(f"max_ejected_share must be in [0, 1], got {self.max_ejected_share}")
        if not 0.0 < self.ramp_start <= 1.0:
            raise ValueError(f"ramp_start must be in (0, 1], got {self.ramp_start}")
        if self.ramp_factor <= 1.0:
            raise ValueError(f"ramp_factor must be > 1, got {self.ramp_factor}")
        if any(not p for p in self.oom_patterns):
            raise ValueError("oom_patterns must not hold an empty string")


def with_alias(cfg: OutlierConfig, passive_failure_threshold: int) -> OutlierConfig:
    """The config with [health_check] passive_failure_threshold applied: nonzero, it wins."""
    if passive_failure_threshold <= 0:
        return cfg
    return replace(cfg, consecutive_failures=passive_failure_threshold)


@dataclass(frozen=True, slots=True)
class Ejection:
    """One ejection: who, why, until when, and the how-manieth it is (after decay)."""

    replica: str
    reason: str
    duration_s: float
    until: float
    count: int


@dataclass(slots=True)
class _Record:
    consecutive: int = 0
    # Failure-rate window: [bucket start, requests, failures], oldest first.
    window: deque[list[float]] = field(default_factory=deque)
    requests: int = 0
    failures: int = 0
    ejections: int = 0
    # When the ejection count last stopped growing or decayed (an ejection's end).
    clean_since: float = 0.0
    ejected_until: float | None = None
    ramp_from: float | None = None
    credit: float = 0.0
    seen_up: bool = False


class OutlierPolicy:
    """Every replica's passive record, ejection and ramp; `now` is always the caller's clock."""

    def __init__(self, cfg: OutlierConfig, names: Iterable[str]) -> None:
        self.config = cfg
        self._records = {name: _Record() for name in names}
        self._patterns = tuple(p.lower() for p in cfg.oom_patterns)
        self._bucket_s = cfg.failure_rate_window_s / _BUCKETS
        self._cap = 0
        self._resize()
        self._ejected: set[str] = set()
        self._ramping: set[str] = set()
        # Ramp steps from ramp_start to a full share.
        self._steps = math.ceil(math.log(1.0 / cfg.ramp_start) / math.log(cfg.ramp_factor) - 1e-12)
        # The earliest time tick() has something to do (an ejection or a ramp ending).
        self.next_event = math.inf

    def _resize(self) -> None:
        fleet = len(self._records)
        self._cap = max(1, math.floor(self.config.max_ejected_share * fleet)) if fleet >= 2 else 0

    def add(self, name: str, slow_start: bool = True) -> None:
        """A replica joins at runtime; with `slow_start` its first time up ramps like a return."""
        self._records[name] = _Record(seen_up=slow_start)
        self._resize()

    def remove(self, name: str) -> None:
        """A replica leaves: its record, ejection and ramp go with it."""
        self._records.pop(name, None)
        self._ejected.discard(name)
        self._ramping.discard(name)
        self._resize()

    # --- passive outcomes -------------------------------------------------------------------

    def success(self, name: str, now: float) -> None:
        # A removed replica's last streams still end (after a forced removal): nothing to record.
        rec = self._records.get(name)
        if rec is None or rec.ejected_until is not None:
            return  # an answer started before the ejection says nothing new
        rec.consecutive = 0
        self._count(rec, now, failed=False)

    def failure(self, name: str, now: float, detail: str, others_routable: int) -> Ejection | None:
        """A failed request; the ejection it triggers, if the detectors and the caps agree."""
        rec = self._records.get(name)
        if rec is None or rec.ejected_until is not None:
            return None
        rec.consecutive += 1
        self._count(rec, now, failed=True)
        reason = self._verdict(rec, detail)
        if reason is None or others_routable < 1 or len(self._ejected) >= self._cap:
            return None
        return self._eject(name, rec, reason, now)

    def preempted(
        self, name: str, now: float, count: float, others_routable: int
    ) -> Ejection | None:
        """`count` preemptions since the last scrape; the ejection a jump triggers, if any."""
        limit = self.config.max_preemptions_per_scrape
        rec = self._records[name]
        if not limit or count <= limit or rec.ejected_until is not None:
            return None
        if others_routable < 1 or len(self._ejected) >= self._cap:
            return None
        return self._eject(name, rec, "preemptions", now)

    def adopt(
        self, name: str, now: float, ejection: Ejection, others_routable: int
    ) -> Ejection | None:
        """Another gateway process ejected `name`: the same here, within this process's caps."""
        rec = self._records.get(name)
        if rec is None or rec.ejected_until is not None:
            return None
        if others_routable < 1 or len(self._ejected) >= self._cap:
            return None
        rec.ejections = max(rec.ejections, ejection.count - 1)
        return self._eject(name, rec, ejection.reason, now, ejection.duration_s)

    def _verdict(self, rec: _Record, detail: str) -> str | None:
        if detail and self._patterns:
            low = detail.lower()
            if any(p in low for p in self._patterns):
                return "out_of_memory"
        cfg = self.config
        if cfg.consecutive_failures and rec.consecutive >= cfg.consecutive_failures:
            return "consecutive_failures"
        if (
            cfg.failure_rate > 0.0
            and rec.requests >= cfg.failure_rate_min_requests
            and rec.failures >= cfg.failure_rate * rec.requests
        ):
            return "failure_rate"
        return None

    def _count(self, rec: _Record, now: float, failed: bool) -> None:
        window = rec.window
        horizon = now - self.config.failure_rate_window_s
        while window and window[0][0] <= horizon:
            _, requests, failures = window.popleft()
            rec.requests -= int(requests)
            rec.failures -= int(failures)
        if not window or now - window[-1][0] >= self._bucket_s:
            window.append([now, 0, 0])
        bucket = window[-1]
        bucket[1] += 1
        rec.requests += 1
        if failed:
            bucket[2] += 1
            rec.failures += 1

    def _eject(
        self, name: str, rec: _Record, reason: str, now: float, duration: float | None = None
    ) -> Ejection:
        cfg = self.config
        if rec.ejections and duration is None:
            decayed = int((now - rec.clean_since) // cfg.decay_s)
            rec.ejections = max(0, rec.ejections - decayed)
        rec.ejections += 1
        if duration is None:
            duration = min(cfg.base_ejection_s * rec.ejections, cfg.max_ejection_s)
        rec.ejected_until = until = now + duration
        rec.clean_since = until
        rec.consecutive = 0
        rec.seen_up = True  # it served: its end is a return, and ramps
        rec.window.clear()
        rec.requests = rec.failures = 0
        self._ejected.add(name)
        self._stop_ramp(name, rec)
        self.next_event = min(self.next_event, until)
        return Ejection(name, reason, duration, until, rec.ejections)

    # --- time -------------------------------------------------------------------------------

    def tick(self, now: float) -> tuple[list[str], list[str]]:
        """(ejections that ended, ramps that reached a full share) by `now`."""
        if now < self.next_event:
            return [], []
        ended = [n for n in self._ejected if self._until(n) <= now]
        for name in ended:
            self._ejected.discard(name)
            self._records[name].ejected_until = None
        done = [n for n in self._ramping if self._ramp_end(n) <= now]
        for name in done:
            self._stop_ramp(name, self._records[name])
        self.next_event = min(
            (
                *(self._until(n) for n in self._ejected),
                *(self._ramp_end(n) for n in self._ramping),
            ),
            default=math.inf,
        )
        return ended, done

    def _until(self, name: str) -> float:
        until = self._records[name].ejected_until
        assert until is not None
        return until

    def _ramp_end(self, name: str) -> float:
        start = self._records[name].ramp_from
        assert start is not None
        return start + self._steps * self.config.ramp_step_s

    # --- state ------------------------------------------------------------------------------

    def ejected(self, name: str) -> bool:
        return self._records[name].ejected_until is not None

    def ejected_count(self, name: str) -> int:
        """How many times the replica was ejected, less the decay applied at its last one."""
        return self._records[name].ejections

    def up(self, name: str, now: float) -> bool:
        """The replica is routable again; True when that is a return (its ramp starts)."""
        rec = self._records[name]
        returning, rec.seen_up = rec.seen_up, True
        if not returning or self._steps == 0:
            return False
        rec.ramp_from, rec.credit = now, 0.0
        self._ramping.add(name)
        self.next_event = min(self.next_event, self._ramp_end(name))
        return True

    def down(self, name: str) -> None:
        """Health checks hold the replica down: any ramp in progress is over."""
        self._stop_ramp(name, self._records[name])

    def _stop_ramp(self, name: str, rec: _Record) -> None:
        rec.ramp_from = None
        self._ramping.discard(name)

    # --- the ramp ---------------------------------------------------------------------------

    @property
    def ramping(self) -> Set[str]:
        """The replicas ramping up now (read-only: the policy's own set, no copy)."""
        return self._ramping

    def fraction(self, name: str, now: float) -> float:
        """The replica's share of decisions now: 1 unless it is ramping up."""
        start = self._records[name].ramp_from
        if start is None:
            return 1.0
        cfg = self.config
        step = max(0, math.floor((now - start) / cfg.ramp_step_s))
        return min(1.0, cfg.ramp_start * cfg.ramp_factor**step)

    def admitted(self, name: str) -> bool:
        """Whether the replica takes part in the next decision (its ramp's credit allows)."""
        rec = self._records[name]
        return rec.ramp_from is None or rec.credit >= 1.0 - _EPSILON

    def routed(self, name: str, now: float) -> None:
        """A decision went to `name`: every ramping replica earns its fraction, `name` pays 1."""
        for other in self._ramping:
            rec = self._records[other]
            # An admitted replica the router passes over earns nothing more: it keeps one
            # decision in hand, never a burst of them.
            if other == name or rec.credit < 1.0 - _EPSILON:
                rec.credit += self.fraction(other, now)
        if name in self._ramping:
            rec = self._records[name]
            rec.credit = max(0.0, rec.credit - 1.0)
