"""The other processes' messages on the shared channel, applied to this process's state."""

from __future__ import annotations

import time

import orjson

from gateway.replicas.pool import ReplicaPool
from gateway.shared_state.counts import RemoteCounts
from gateway.shared_state.inflight import SharedInflight
from gateway.shared_state.mirror import Mirror, decode_full
from gateway.shared_state.picks import SharedPicks
from gateway.shared_state.scrapes import ScrapeLeases


class Inbox:
    """Applies one pub/sub message: outcomes, prefixes in flight, in-flight counts, ejections,
    scrape results and picks; a malformed one is counted and dropped."""

    __slots__ = (
        "_inflight", "_mirror", "_own", "_picks", "_pool", "_process_id", "_remote", "_scrapes",
    )  # fmt: skip

    def __init__(
        self,
        process_id: str,
        mirror: Mirror,
        inflight: SharedInflight,
        remote: RemoteCounts,
        pool: ReplicaPool,
        scrapes: ScrapeLeases | None,
        picks: SharedPicks,
    ) -> None:
        self._process_id = process_id
        # Our own messages come back on the channel: recognised by their start, not decoded.
        self._own = orjson.dumps({"o": process_id})[:-1] + b","
        self._mirror, self._inflight, self._remote = mirror, inflight, remote
        self._pool, self._scrapes, self._picks = pool, scrapes, picks

    def apply(self, data: bytes) -> None:
        """Apply the message `data` unless this process sent it."""
        if data.startswith(self._own):
            return
        stats = self._mirror.stats
        try:
            origin, raws, ejections, scrapes, inflight, counts, picks = decode_full(data)
        except ValueError:
            stats.malformed += 1
            return
        if origin == self._process_id:
            return
        if counts is not None and not self._remote.pushed(origin, counts, time.monotonic()):
            stats.malformed += 1
        self._mirror.apply_raw(raws)
        if inflight:
            stats.malformed += self._inflight.apply(origin, inflight, self._pool.replicas)
        if picks:
            stats.malformed += self._picks.apply(picks, self._pool.replicas)
        for ejection in ejections:
            self._pool.adopt_ejection(ejection)
        if scrapes and self._scrapes is not None:
            self._scrapes.apply(scrapes)
