"""When to scrape a replica's /metrics next: pure decisions, driven by the score loop.

A scrape costs the replica's API server CPU and holds its event loop (measured in
docs/vllm-cpu.md): time taken from the process that streams its tokens. Between scrapes the
gateway knows its own changes exactly (ReplicaState.snapshot(): scraped load + the gateway's
in-flight delta since), so a scrape adds information only where that model errs: when
someone else loads the replica (the scraped load moved more than our own requests explain),
when its state changes by itself (KV usage, a queue forming), or when our own load moved a
lot since the last look.
While scrapes agree with the model the interval doubles, up to a ceiling; any disagreement
drops it to the fastest. A token bucket caps the sustained rate whatever the cadence wants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.config import ScoreLoopConfig

# Agreement tolerance between a scrape and what the gateway predicted: one request plus a
# quarter of the load. vLLM counts a request from its arrival to its last token, the gateway
# until the client has read the end of the stream, so the two differ by the streams still
# draining and the requests still on the wire: small and noisy, not information.
_SLACK_REQUESTS = 1.0
_SLACK_SHARE = 0.25
# KV usage (0..1) may move this much between two scrapes before its rate shortens the
# interval: routing reads it as a score, a tenth of the cache is its resolution.
_KV_STEP = 0.1
# The budget's bucket holds this many seconds of `max_scrapes_per_s`: a disagreement gets a
# few fast scrapes at once, a replica that always disagrees gets the sustained rate.
_BURST_S = 4.0


@dataclass(frozen=True, slots=True)
class Bounds:
    """The cadence's limits, each at least the one before it (see ScoreLoopConfig)."""

    fastest_s: float
    steady_s: float
    idle_s: float
    max_per_s: float

    @classmethod
    def of(cls, cfg: ScoreLoopConfig, workers: int = 1) -> Bounds:
        """The bounds of one of `workers` gateway processes on a host, which split the budget."""
        # Each worker scrapes every replica: split, a replica's cost does not grow N-fold.
        steady = max(cfg.steady_scrape_interval_s, cfg.scrape_interval_s)
        return cls(
            cfg.scrape_interval_s,
            steady,
            max(cfg.idle_scrape_interval_s, steady),
            cfg.max_scrapes_per_s / max(1, workers),
        )

    @property
    def burst(self) -> float:
        """Scrapes the budget's bucket holds (at least one)."""
        return max(1.0, self.max_per_s * _BURST_S)


@dataclass(frozen=True, slots=True)
class Observation:
    """One good scrape's load figures, and the gateway's own in-flight count at that moment."""

    at: float
    running: float | None
    waiting: float | None
    kv_usage: float | None
    in_flight: int

    @property
    def load(self) -> float | None:
        """Requests on the replica (running + waiting), when both are known."""
        if self.running is None or self.waiting is None:
            return None
        return self.running + self.waiting


def _slack(load: float) -> float:
    return _SLACK_REQUESTS + _SLACK_SHARE * max(load, 0.0)


def surprised(prev: Observation, last: Observation) -> bool:
    """Whether `last` disagrees with `prev` plus the gateway's own changes in between."""
    ours = last.in_flight - prev.in_flight
    if prev.load is not None and last.load is not None:
        predicted = max(0.0, prev.load + ours)
        if abs(last.load - predicted) > _slack(max(last.load, predicted)):
            return True  # another client, or requests ended that we still count
    if prev.waiting is not None and last.waiting is not None:
        # Our arrivals wait until vLLM schedules them; a queue beyond them is KV pressure.
        predicted = prev.waiting + max(0, ours)
        if last.waiting - predicted > _slack(predicted):
            return True
    return False


def moved(last: Observation, in_flight_now: int) -> bool:
    """Whether the gateway's own load moved since `last` more than the agreement slack."""
    return abs(in_flight_now - last.in_flight) > _slack(last.in_flight)


def busy(bounds: Bounds, last: Observation, in_flight_now: int, since_routed_s: float) -> bool:
    """Work on the replica (ours or scraped), or a request routed there lately."""
    return (
        in_flight_now > 0
        or last.in_flight > 0
        or (last.load or 0.0) > 0.0
        or since_routed_s < bounds.idle_s
    )


def next_interval(
    bounds: Bounds,
    prev: Observation | None,
    last: Observation,
    previous_s: float,
    in_flight_now: int,
    since_routed_s: float,
) -> float:
    """Seconds from the scrape `last` to the next one.

    `prev` is the scrape before `last` (None: none since the replica started), `previous_s`
    the interval that led from it to `last`, `in_flight_now` the gateway's own count now and
    `since_routed_s` the time since a request was last routed to the replica. Called again
    between scrapes (the gateway's load changes), it may bring the next scrape forward.
    """
    ceiling = (
        bounds.steady_s if busy(bounds, last, in_flight_now, since_routed_s) else bounds.idle_s
    )
    if prev is None or surprised(prev, last) or moved(last, in_flight_now):
        interval = bounds.fastest_s
    else:
        interval = 2.0 * previous_s
        dt = last.at - prev.at
        if prev.kv_usage is not None and last.kv_usage is not None and dt > 0:
            rate = abs(last.kv_usage - prev.kv_usage) / dt
            if rate > 0:
                interval = min(interval, _KV_STEP / rate)
    return min(max(interval, bounds.fastest_s), ceiling)


@dataclass(frozen=True, slots=True)
class Budget:
    """A token bucket of scrapes: in any T seconds at most burst + max_per_s x T of them."""

    tokens: float
    at: float

    @classmethod
    def full(cls, bounds: Bounds, now: float) -> Budget:
        return cls(bounds.burst, now)

    def _level(self, bounds: Bounds, now: float) -> float:
        return min(bounds.burst, self.tokens + max(0.0, now - self.at) * bounds.max_per_s)

    def ready_at(self, bounds: Bounds, now: float) -> float:
        """The earliest time, from `now` on, that a scrape may start."""
        level = self._level(bounds, now)
        return now if level >= 1.0 else now + (1.0 - level) / bounds.max_per_s

    def spend(self, bounds: Bounds, now: float) -> Budget:
        """The bucket after a scrape at `now` (callers wait for ready_at first)."""
        return Budget(self._level(bounds, now) - 1.0, now)


def due_at(
    bounds: Bounds,
    scraped_at: float,
    interval_s: float,
    budget: Budget,
    last_attempt: float,
    now: float,
) -> float:
    """When the next scrape starts: the cadence's time, never sooner than the fastest bound
    after the last attempt (failed ones too) nor before the budget allows."""
    cadence = scraped_at + interval_s
    return max(cadence, last_attempt + bounds.fastest_s, budget.ready_at(bounds, now))


NEVER = -math.inf
