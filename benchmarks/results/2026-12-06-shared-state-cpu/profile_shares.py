"""Shares of py-spy raw samples (`py-spy record -f raw`) by shared-state loop: a run's profile."""

from __future__ import annotations

import collections
import sys

REQUEST_PATHS = (
    "gateway/proxy",
    "gateway/http",
    "gateway/replicas",
    "routing/",
    "cache_index/",
    "uvicorn",
    "telemetry/",
    "httptools",
    "h11",
)
# First matching rule names a sample (its whole stack, frames joined by ";").
RULES = [
    ("beat (_poller/_beat)", ("_poller (", "_beat (")),
    ("flush (_flusher/_flush)", ("_flusher (", "_flush (")),
    ("subscriber (_subscriber/_on_message)", ("_subscriber (", "_on_message (")),
    ("shared-state other (connector/scrapes/on_record)", ("gateway/shared_state/",)),
    # asyncio.wait_for (redis-py's socket_timeout) runs each send in a task of its own.
    ("redis-py sends in their own task (socket writes)", ("redis/",)),
    (
        "proxy/http/routing (requests)",
        REQUEST_PATHS,
    ),
]


def category(stack: str) -> str:
    for name, keys in RULES:
        if any(k in stack for k in keys):
            return name
    return "event loop (uvloop, C) / other"


def main(path: str) -> None:
    totals: collections.Counter[str] = collections.Counter()
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            totals[category(stack)] += int(count)
    n = sum(totals.values())
    print(f"samples {n}")
    for name, c in totals.most_common():
        print(f"{c / n:6.1%} {c:5d} {name}")


if __name__ == "__main__":
    main(sys.argv[1])
