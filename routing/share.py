"""Each replica's share of a picker's recent picks: the balance bound that needs no load.

Load-based guards only act once load is out of line, and at low concurrency it never is: four
requests in flight over four replicas leave every guard far away while one replica collects
most new prefixes, one request at a time. A count of the last `window` picks sees that at once,
at any load, and forgets it as the picks roll out (no decay clock: routing stays pure).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping, Sequence

from routing.types import ReplicaSnapshot


class _Counted:
    """The last `window` keys, counted per key."""

    __slots__ = ("_keys", "counts")

    def __init__(self, window: int) -> None:
        self._keys: deque[Hashable] = deque(maxlen=max(0, window))
        self.counts: dict[Hashable, int] = {}

    def add(self, key: Hashable) -> None:
        keys, counts = self._keys, self.counts
        if keys.maxlen == 0:
            return
        if len(keys) == keys.maxlen:
            old = keys[0]
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                del counts[old]
        keys.append(key)
        counts[key] = counts.get(key, 0) + 1


class ShareWindow:
    """The replica names of the last `window` picks, counted per replica; with `join_slack`,
    those of new conversations (picks without affinity) apart, which prefix each joined, and
    those that joined none (a prefix started there)."""

    __slots__ = ("_joined", "_joins", "_picks", "_slack", "_starts", "counting", "last")

    def __init__(self, window: int, join_slack: float | None = None) -> None:
        self._picks = _Counted(window)
        self.counting = window > 0
        # (new, prefix) of the last pick made here, for the other gateway processes to count.
        self.last: tuple[bool, int | None] | None = None
        self._slack = join_slack
        joins = window if join_slack is not None else 0
        self._joins, self._joined = _Counted(joins), _Counted(joins)
        self._starts = _Counted(joins)

    def record(self, name: str, new: bool = False, prefix: int | None = None) -> None:
        """Count one pick of `name`; `new`: of a new conversation, joining `prefix` (the hash
        of the deepest block it matched there; None: it matched nothing there)."""
        self.last = (new, prefix)
        self.observe(name, new, prefix)

    def observe(self, name: str, new: bool = False, prefix: int | None = None) -> None:
        """Count a pick another gateway process made (shared state), as `record` does."""
        self._picks.add(name)
        if new:
            self._joins.add(name)
            if prefix is not None:
                self._joined.add((name, prefix))
            else:
                self._starts.add(name)

    def counts(self, replicas: Sequence[ReplicaSnapshot]) -> list[int]:
        """Recent picks of each of `replicas`, in their order."""
        get = self._picks.counts.get
        return [get(r.name, 0) for r in replicas]

    def joins(self, replicas: Sequence[ReplicaSnapshot]) -> Joins | None:
        """The new conversations' view, None when not counted (no join_slack)."""
        if self._slack is None:
            return None
        get, started = self._joins.counts.get, self._starts.counts.get
        names = [r.name for r in replicas]
        starts = [started(n, 0) for n in names]
        return Joins([get(n, 0) for n in names], self._slack, names, self._joined.counts, starts)


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

    def over_fewest(self, i: int) -> bool:
        """True when replica i has more than the room (ratio 1: the slack) over the fewest."""
        return self._counts[i] > min(self._counts) + self._room

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


class Joins(Shares):
    """One decision's view of the recent new conversations: who may take another one."""

    __slots__ = ("_joined", "_names", "_starts")

    def __init__(
        self,
        counts: list[int],
        slack: float,
        names: Sequence[str],
        joined: Mapping[Hashable, int],
        starts: Sequence[int] = (),
    ) -> None:
        super().__init__(counts, 1.0, slack)
        self._names, self._joined = names, joined
        self._starts = starts or [0] * len(counts)

    def evenly(self, among: Sequence[int], loads: Sequence[float], band: float) -> list[int]:
        """Those of `among` within `band` of their least load that started the fewest prefixes,
        of those the fewest new conversations."""
        # Prefixes started, not conversations: a group's later joiners arrive a while after its
        # first, so a count of conversations lags and can tie a replica that started more groups
        # with one that started fewer (benchmarks/results/2026-12-05-start-balance).
        floor = min(loads[i] for i in among) + band
        near = [i for i in among if loads[i] <= floor]
        starts = self._starts
        low = min(starts[i] for i in near)
        return self.fewest([i for i in near if starts[i] == low])

    def refused(self, i: int, prefix: int | None) -> bool:
        """True when replica i has over `slack` more new conversations than the fewest's and
        one already joined `prefix` there: the first to join a prefix keeps a group together
        (two users of one document), later ones are copied out (a prompt every user shares)."""
        first = prefix is not None and (self._names[i], prefix) not in self._joined
        return not first and self.over_fewest(i)
