"""Routing picks shared between processes: every process's share window counts them all.

The affinity_guard picker balances new conversations and prefix starts over the replicas by
counting its recent picks (routing/share.py). Counted per process, each of N processes balances
its own picks and their sum does not balance: two workers placed 84 conversations 6 to 14 per
replica where one process placed 10 to 12, and consecutive conversations shared a replica more
often (benchmarks/results/2026-12-08-shared-picks). Here each pick rides in the next flush ("p"
of the message) and the others count it as if they had made it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import Any

from gateway.shared_state.inflight import take_batch

# A pick on the wire: [replica, new conversation, prefix it joined or None].
PickEvent = list[Any]
Observe = Callable[[str, bool, int | None], None]


class SharedPicks:
    """This process's picks, told to the others while the link is up, and theirs applied."""

    __slots__ = ("_events", "_up", "_wake", "applied", "observe", "told")

    def __init__(self, max_pending: int, up: Callable[[], bool], wake: Callable[[], None]):
        self._events: deque[PickEvent] = deque(maxlen=max_pending)
        self._up, self._wake = up, wake
        # Where the others' picks go: the runtime points it at its router's share window.
        self.observe: Observe = lambda _replica, _new, _prefix: None
        # Counters for the metrics: picks told to the others, and theirs counted here.
        self.told = 0
        self.applied = 0

    def add(self, replica: str, new: bool, prefix: int | None) -> None:
        """This process picked `replica` (for a new conversation: `new`; joining `prefix`)."""
        if self._up():
            self._events.append([replica, new, prefix])
            self.told += 1
            self._wake()

    def drain(self) -> list[PickEvent]:
        """Picks to publish, oldest first."""
        return take_batch(self._events)

    @property
    def pending(self) -> bool:
        return bool(self._events)

    def apply(self, raws: Iterable[Any], replicas: Collection[str]) -> int:
        """Another process's picks; returns how many were malformed (skipped)."""
        bad = 0
        for raw in raws:
            match raw:
                case [str(replica), bool(new), prefix] if prefix is None or type(prefix) is int:
                    if replica in replicas:  # else one this process does not route to
                        self.observe(replica, new, prefix)
                        self.applied += 1
                case _:
                    bad += 1
        return bad
