"""In-flight counts between processes: pushed with the flush, healed by the lease beat.

Polling the others' leases every 10 ms cost a process ~0.05 of a core under load
(benchmarks/results/2026-12-06-shared-state-cpu). Instead a change of this process's counts
rides the next flush (the message's "c": [version, {replica: count}]), and the lease beat
(every `inflight_idle_poll_s`) rewrites the lease with the same version and reads everyone's:
it heals what a lost message left wrong and drops a process whose lease ran out. Versions
grow with each change, so an older lease never overwrites a newer push.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gateway.replicas.pool import ReplicaPool

# The lease hash's field holding its version: replica names are never empty.
VERSION_FIELD = ""


class LocalCounts:
    """This process's in-flight counts by replica, each distinct one under a new version."""

    __slots__ = ("_counts", "_pool", "_pushed", "_wake", "dirty", "version")

    def __init__(self, pool: ReplicaPool, wake: Callable[[], None]) -> None:
        self._pool = pool
        self._wake = wake
        self._counts: dict[str, int] = {}
        self.version = 0
        # Set by the pool's hook on each start and end; cleared when a flush takes them.
        self.dirty = False
        self._pushed = 0

    def changed(self) -> None:
        """The pool's hook: a request started or ended here; the next flush tells the others."""
        self.dirty = True
        self._wake()

    def snapshot(self) -> tuple[int, dict[str, int]]:
        """(version, counts) now: a new version only when the counts differ."""
        now = {r.name: r.in_flight for r in self._pool if r.in_flight > 0}
        if now != self._counts:
            self._counts = now
            self.version += 1
        return self.version, self._counts

    def take(self) -> list[Any] | None:
        """What the flush pushes: the counts if changed since the last push, else None."""
        if not self.dirty:
            return None
        self.dirty = False
        version, counts = self.snapshot()
        if version == self._pushed:
            return None
        self._pushed = version
        return [version, counts]

    def lost(self) -> None:
        """The link went down: push the counts again once it is back."""
        self._pushed = -1
        self.dirty = True


def _counts_of(raw: Any) -> dict[str, int] | None:
    if not isinstance(raw, dict):
        return None
    if not all(type(k) is str and type(n) is int and n >= 0 for k, n in raw.items()):
        return None
    return raw


class RemoteCounts:
    """The other processes' counts (origin -> version, counts, last heard of), summed into
    the pool's `remote_in_flight`."""

    __slots__ = ("_by_origin", "_pool", "_ttl_s")

    def __init__(self, pool: ReplicaPool, ttl_s: float) -> None:
        self._pool = pool
        self._ttl_s = ttl_s
        self._by_origin: dict[str, tuple[int, dict[str, int], float]] = {}

    def pushed(self, origin: str, raw: Any, now: float) -> bool:
        """A push from `origin` ([version, counts]); False when malformed (ignored)."""
        match raw:
            case [int(version), counts_raw]:
                counts = _counts_of(counts_raw)
            case _:
                return False
        if counts is None:
            return False
        held = self._by_origin.get(origin)
        if held is None or version > held[0]:
            self._by_origin[origin] = (version, counts, now)
            self._publish()
        return True

    def beat(self, answer: Sequence[Any], sent_at: float, now: float) -> int:
        """The beat's answer ({peers, process id, its lease hash, ...}); returns the peers."""
        live: set[str] = set()
        changed = False
        for i in range(1, len(answer) - 1, 2):
            origin, flat = answer[i].decode(), answer[i + 1]
            live.add(origin)
            lease = {flat[j].decode(): int(flat[j + 1]) for j in range(0, len(flat) - 1, 2)}
            # A lease without one (an older gateway, or one that expired) is taken as is.
            version = lease.pop(VERSION_FIELD, -1)
            held = self._by_origin.get(origin)
            if held is None or version >= held[0]:
                changed = changed or held is None or held[1] != lease
                self._by_origin[origin] = (version, lease, now)
            else:
                self._by_origin[origin] = (held[0], held[1], now)
        for origin, (_, _, at) in list(self._by_origin.items()):
            # Gone from the live processes (lease ran out, or stopped), and not heard of since.
            if origin not in live and at < sent_at:
                del self._by_origin[origin]
                changed = True
        if changed:
            self._publish()
        return int(answer[0])

    def expire(self, now: float) -> None:
        """Drop the processes not heard of for a lease TTL (no beat answered meanwhile)."""
        oldest = now - self._ttl_s
        dead = [o for o, (_, _, at) in self._by_origin.items() if at <= oldest]
        for origin in dead:
            del self._by_origin[origin]
        if dead:
            self._publish()

    def clear(self) -> None:
        self._by_origin.clear()
        self._pool.set_remote_in_flight({})

    def _publish(self) -> None:
        total: dict[str, int] = {}
        for _, counts, _ in self._by_origin.values():
            for name, n in counts.items():
                total[name] = total.get(name, 0) + n
        self._pool.set_remote_in_flight(total)
