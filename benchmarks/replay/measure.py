"""What one replay cost and where it went: replica counters and CPU seconds before and after."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from benchmarks.overhead_procs import cpu_seconds_of
from benchmarks.procs import descendants
from benchmarks.routing_bench.fleet import (
    HITS,
    PREEMPTIONS,
    QUERIES,
    RUNNING,
    SUCCESS,
    WAITING,
    scrape,
)
from benchmarks.routing_bench.runner import machine_busy_s

COUNTERS = (HITS, QUERIES, SUCCESS, PREEMPTIONS, RUNNING, WAITING)


def group_cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds of each process and all its descendants (a vLLM replica's engine core)."""
    # dict.fromkeys: once each, though a peer's pids() already lists its descendants.
    return cpu_seconds_of(list(dict.fromkeys(x for p in pids for x in (p, *descendants(p)))))


@dataclass(frozen=True, slots=True)
class CpuMark:
    """CPU seconds so far of the replicas, the contender, this client and the whole machine."""

    t: float
    replicas: float
    contender: float
    client: float
    machine: float | None

    @classmethod
    def take(cls, replica_pids: Sequence[int], contender_pids: Sequence[int]) -> CpuMark:
        machine = None
        with contextlib.suppress(OSError, ValueError):
            machine = machine_busy_s()
        return cls(
            time.monotonic(),
            group_cpu_s(replica_pids),
            group_cpu_s(contender_pids),
            group_cpu_s([os.getpid()]),
            machine,
        )


def cpu_delta(a: CpuMark, b: CpuMark) -> dict[str, float | None]:
    """CPU seconds between two marks; `others`: the rest of the machine (a shared one)."""
    ours = [b.replicas - a.replicas, b.contender - a.contender, b.client - a.client]
    others = None
    if a.machine is not None and b.machine is not None:
        others = round(max(0.0, b.machine - a.machine - sum(ours)), 2)
    return {
        "replica_cpu_s": round(ours[0], 2),
        "contender_cpu_s": round(ours[1], 2),
        "client_cpu_s": round(ours[2], 2),
        "others_cpu_s": others,
    }


async def counters(session: aiohttp.ClientSession, urls: tuple[str, ...]) -> list[dict[str, float]]:
    """Every replica's own counters (summed over label sets), in replica order."""
    return await scrape(session, urls, COUNTERS)


def deltas(
    before: Sequence[Mapping[str, float]], after: Sequence[Mapping[str, float]], name: str
) -> list[float]:
    """One counter's growth on each replica."""
    return [b[name] - a[name] for a, b in zip(before, after, strict=True)]


def shares(counts: Sequence[float]) -> list[float] | None:
    """Each replica's fraction of the requests; None when none finished."""
    total = sum(counts)
    return [round(c / total, 4) for c in counts] if total > 0 else None


def max_min_share(share: Sequence[float] | None) -> float | None:
    """Largest over smallest share; None without shares or when a replica got none."""
    if not share or min(share) <= 0:
        return None
    return round(max(share) / min(share), 3)


def hit_rate(
    before: Sequence[Mapping[str, float]], after: Sequence[Mapping[str, float]]
) -> float | None:
    """Prefix-cache hits over queries, both summed over the replicas."""
    queries = sum(deltas(before, after, QUERIES))
    return round(sum(deltas(before, after, HITS)) / queries, 4) if queries > 0 else None
