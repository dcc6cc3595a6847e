"""Each replica's share of a picker's recent picks: the balance bound that needs no load.

Load-based guards only act once load is out of line, and at low concurrency it never is: four
requests in flight over four replicas leave every guard far away while one replica collects
most new prefixes, one request at a time. A count of the last `window` picks sees that at once,
at any load, and forgets it as the picks roll out (no decay clock: routing stays pure).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from routing.types import ReplicaSnapshot


class ShareWindow:
    """The replica names of the last `window` picks, counted per replica."""

    __slots__ = ("_counts", "_picks")

    def __init__(self, window: int) -> None:
        self._picks: deque[str] = deque(maxlen=max(0, window))
        self._counts: dict[str, int] = {}

    def record(self, name: str) -> None:
        """Count one pick of `name`, forgetting the oldest once the window is full."""
        picks, counts = self._picks, self._counts
        if picks.maxlen == 0:
            return
        if len(picks) == picks.maxlen:
            old = picks[0]
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                del counts[old]
        picks.append(name)
        counts[name] = counts.get(name, 0) + 1

    def counts(self, replicas: Sequence[ReplicaSnapshot]) -> list[int]:
        """Recent picks of each of `replicas`, in their order."""
        get = self._counts.get
        return [get(r.name, 0) for r in replicas]


class Shares:
    """One decision's view of the window: who is over its share, who was picked least."""

    __slots__ = ("_counts", "_mean", "_room")

    def __init__(self, counts: list[int], ratio: float, slack: float) -> None:
        self._counts = counts
        self._mean = sum(counts) / len(counts)
        self._room = (ratio - 1.0) * self._mean + slack

    def over(self, i: int, weight: float = 1.0) -> bool:
        """True when replica i has more than mean + weight x room of the recent picks."""
        return self._counts[i] > self._mean + weight * self._room

    def count(self, i: int) -> int:
        """Recent picks of replica i."""
        return self._counts[i]

    def fewest(self, tied: Sequence[int]) -> list[int]:
        """The indices among `tied` with the fewest recent picks."""
        counts = self._counts
        low = min(counts[i] for i in tied)
        return [i for i in tied if counts[i] == low]

    def evenly(self, among: Sequence[int], loads: Sequence[float], band: float) -> list[int]:
        """The fewest picked of `among` whose load is within `band` of their least."""
        floor = min(loads[i] for i in among) + band
        return self.fewest([i for i in among if loads[i] <= floor])
