"""What the gateway did while a real replica died and came back, seen from inside its process.

The real-vLLM fault run starts the gateway in-process (`running_gateway`), so an observer can
sample the pool's own state every few milliseconds (no gauge exposes retries in flight) and
capture the outlier and health log lines with their times. The analysis functions below are
pure: they read the samples and events only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.runtime import Runtime

# The loggers whose lines say when a replica was ejected, went down, came back, ramped.
LOGGERS = ("llm_gateway.outlier", "llm_gateway.health")
_EJECTED = re.compile(r"replica (\S+) ejected for \d+ s: (\S+) \(ejection \d+\)")


@dataclass(frozen=True, slots=True)
class Sample:
    """The pool at one instant (seconds since the load began), one entry per replica."""

    t: float
    routable: tuple[bool, ...]
    ejected: tuple[bool, ...]
    # Attempts ever leased to the replica: released ones plus those in flight.
    acquired: tuple[int, ...]
    in_flight: tuple[int, ...]
    admit: tuple[float, ...]
    # Retried attempts in flight (the pipeline's retry-budget count).
    retrying: int
    queued: int


@dataclass(frozen=True, slots=True)
class LogEvent:
    t: float
    logger: str
    message: str


class _Capture(logging.Handler):
    def __init__(self, t0: float, events: list[LogEvent]) -> None:
        super().__init__(logging.INFO)
        self._t0, self._events = t0, events

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        self._events.append(LogEvent(time.monotonic() - self._t0, record.name, msg))


@dataclass
class Observer:
    """Samples `runtime`'s pool every `period_s` until stopped; keeps its outlier log lines."""

    runtime: Runtime
    names: tuple[str, ...]
    t0: float
    period_s: float = 0.02
    samples: list[Sample] = field(default_factory=list)
    events: list[LogEvent] = field(default_factory=list)

    def sample(self) -> Sample:
        pool, outlier = self.runtime.pool, self.runtime.pool.outlier
        now = pool.clock()
        reps = [pool[n] for n in self.names]
        admission = self.runtime.admission
        queued = sum(admission.queue.depth().values()) if admission is not None else 0
        retrying: int = self.runtime.pipeline._retrying  # no public gauge of it
        s = Sample(
            t=time.monotonic() - self.t0,
            routable=tuple(r.healthy and not r.drained for r in reps),
            ejected=tuple(outlier.ejected(n) for n in self.names),
            acquired=tuple(r.requests_total + r.in_flight for r in reps),
            in_flight=tuple(r.in_flight for r in reps),
            admit=tuple(outlier.fraction(n, now) for n in self.names),
            retrying=retrying,
            queued=queued,
        )
        self.samples.append(s)
        return s

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Capture the outlier and health loggers' lines (INFO and up) while inside."""
        handler = _Capture(self.t0, self.events)
        saved = []
        for name in LOGGERS:
            lg = logging.getLogger(name)
            saved.append((lg, lg.level))
            lg.setLevel(logging.INFO)
            lg.addHandler(handler)
        try:
            yield
        finally:
            for lg, level in saved:
                lg.removeHandler(handler)
                lg.setLevel(level)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.period_s)  # the sampling period
        self.sample()


# --- analysis (pure) --------------------------------------------------------------------------


def ejection_after(events: Sequence[LogEvent], name: str, after: float) -> tuple[float, str] | None:
    """(time, rule) of the first ejection of `name` logged at or after `after`."""
    for e in events:
        m = _EJECTED.search(e.message)
        if e.t >= after and m is not None and m.group(1) == name:
            return e.t, m.group(2)
    return None


def first_event(events: Sequence[LogEvent], text: str, after: float) -> float | None:
    """Time of the first logged line at or after `after` that contains `text`."""
    return next((e.t for e in events if e.t >= after and text in e.message), None)


def routed_while_out(samples: Sequence[Sample], i: int, start: float, end: float) -> int:
    """Attempts leased to replica i between two samples that both found it unroutable."""
    n = 0
    for a, b in itertools.pairwise(samples):
        if start <= a.t and b.t <= end and not a.routable[i] and not b.routable[i]:
            n += b.acquired[i] - a.acquired[i]
    return n


def first_sample(samples: Sequence[Sample], after: float, routable: bool, i: int) -> float | None:
    """Time of the first sample at or after `after` where replica i's routability is `routable`."""
    return next((s.t for s in samples if s.t >= after and s.routable[i] == routable), None)


def acquired_between(samples: Sequence[Sample], i: int, start: float, end: float) -> int:
    """Attempts leased to replica i from the last sample before `start` to the first after `end`."""
    before = [s for s in samples if s.t <= start]
    after = [s for s in samples if s.t >= end]
    if not before or not after:
        return 0
    return after[0].acquired[i] - before[-1].acquired[i]


def share_windows(
    samples: Sequence[Sample], i: int, start: float, window_s: float
) -> list[dict[str, Any]]:
    """Replica i's share of the attempts in each `window_s` from `start` on (whole windows)."""
    rows: list[dict[str, Any]] = []
    at = start
    last = samples[-1].t if samples else start
    while at + window_s <= last + 1e-9:
        a = max((s for s in samples if s.t <= at), key=lambda s: s.t, default=None)
        b = max((s for s in samples if s.t <= at + window_s), key=lambda s: s.t, default=None)
        # The fraction once the window began (the sample before may predate a ramp's start).
        c = next((s for s in samples if s.t >= at), None)
        if a is None or b is None or c is None:
            break
        total = sum(b.acquired) - sum(a.acquired)
        mine = b.acquired[i] - a.acquired[i]
        rows.append({
            "from_s": round(at - start, 1),
            "to_s": round(at + window_s - start, 1),
            "attempts": total,
            "to_replica": mine,
            "share": round(mine / total, 3) if total else 0.0,
            "admit_fraction_at_start": round(c.admit[i], 3),
        })  # fmt: skip
        at += window_s
    return rows


def budget_view(samples: Sequence[Sample], ratio: float, floor: int) -> dict[str, Any]:
    """Retries in flight against the budget's bound, max(floor, ratio x active), per sample."""
    over = [s for s in samples if s.retrying > max(floor, ratio * (sum(s.in_flight)))]
    peak = max(samples, key=lambda s: s.retrying, default=None)
    return {
        "samples": len(samples),
        "sampled_s": round(samples[-1].t - samples[0].t, 1) if samples else 0.0,
        "samples_with_retries_in_flight": sum(1 for s in samples if s.retrying),
        "peak_retries_in_flight": peak.retrying if peak else 0,
        "active_at_peak": sum(peak.in_flight) if peak else 0,
        "bound_at_peak": max(floor, ratio * sum(peak.in_flight)) if peak else floor,
        "samples_over_bound": len(over),
    }
