"""Routing outcomes (and ejections, scrape results) on the wire; the others' applied here.

An outcome is (version, replica, prompt hash, session key, leading block hashes): the version
is the deciding process's wall clock in microseconds, so the latest decision wins in every
process and in Redis (clock skew between hosts only reorders near-simultaneous decisions).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import orjson

from cache_index.session_affinity import session_hash
from gateway.proxy.affinity import Affinity
from gateway.replicas.outlier import Ejection
from gateway.replicas.pool import ReplicaPool

# (version µs, replica, prompt hash or None, session key or None, block hashes)
Outcome: TypeAlias = tuple[int, str, int | None, int | None, Sequence[int]]


@dataclass(slots=True)
class MirrorStats:
    """What the mirror did with the outcomes it was handed."""

    applied: int = 0
    # Older than what the local entry holds (a later decision is known here): not applied.
    stale: int = 0
    unknown_replica: int = 0
    malformed: int = 0


def outcome_of(
    version_us: int,
    replica: str,
    prompt: int | None,
    session: str | None,
    blocks: Sequence[int],
    max_blocks: int,
) -> Outcome:
    """One routing outcome as published (the session id travels as its hash)."""
    key = session_hash(session) if session is not None else None
    return (version_us, replica, prompt, key, tuple(blocks[:max_blocks]))


def encode(
    origin: str,
    outcomes: Sequence[Outcome],
    ejections: Sequence[Ejection] = (),
    scrapes: Sequence[Any] = (),
    inflight: Sequence[Any] = (),
    counts: list[Any] | None = None,
    picks: Sequence[Any] = (),
) -> bytes:
    """One pub/sub message: the origin process, its outcomes, ejections, scrape results,
    requests in flight started and ended, its in-flight counts and its routing picks."""
    msg: dict[str, Any] = {"o": origin, "e": outcomes}
    if ejections:
        msg["j"] = [(e.replica, e.reason, e.duration_s, e.count) for e in ejections]
    if scrapes:
        msg["s"] = scrapes  # shared_state/scrapes.py: checked one by one where applied
    if inflight:
        msg["f"] = inflight  # shared_state/inflight.py: checked one by one where applied
    if counts is not None:
        msg["c"] = counts  # shared_state/counts.py: checked where applied
    if picks:
        msg["p"] = picks  # shared_state/picks.py: checked one by one where applied
    return orjson.dumps(msg)


def decode(data: bytes) -> tuple[str, list[Any], list[Ejection]]:
    """(origin, raw outcomes, ejections) of a message; ValueError when it is not one of ours."""
    return decode_message(data)[:3]


def decode_message(data: bytes) -> tuple[str, list[Any], list[Ejection], list[Any]]:
    """decode's answer and the message's raw scrape results."""
    return decode_full(data)[:4]


def decode_full(
    data: bytes,
) -> tuple[str, list[Any], list[Ejection], list[Any], list[Any], Any, list[Any]]:
    """decode_message's answer, the message's raw in-flight starts and ends, its raw
    in-flight counts (None: none) and its raw picks."""
    msg = orjson.loads(data)
    if not isinstance(msg, dict) or not isinstance(msg.get("o"), str):
        raise ValueError("not a shared-state message")
    events = msg.get("e")
    if not isinstance(events, list):
        raise ValueError("no outcomes")
    ejections: list[Ejection] = []
    for raw in msg.get("j", ()):
        match raw:
            case [str(replica), str(reason), float(duration) | int(duration), int(count)] if (
                duration > 0 and count > 0
            ):
                # Duration from the receipt: the message's latency is milliseconds.
                ejections.append(Ejection(replica, reason, float(duration), 0.0, count))
            case _:
                raise ValueError("malformed ejection")
    scrapes = msg.get("s", [])
    if not isinstance(scrapes, list):
        raise ValueError("malformed scrape results")
    inflight = msg.get("f", [])
    if not isinstance(inflight, list):
        raise ValueError("malformed requests in flight")
    picks = msg.get("p", [])
    if not isinstance(picks, list):
        raise ValueError("malformed picks")
    return msg["o"], events, ejections, scrapes, inflight, msg.get("c"), picks


def split(
    outcomes: list[Outcome], per_message: int, blocks_per_message: int
) -> list[list[Outcome]]:
    """Outcomes cut into messages of at most `per_message` outcomes, `blocks_per_message` blocks."""
    parts: list[list[Outcome]] = []
    part: list[Outcome] = []
    blocks = 0
    for o in outcomes:
        if part and (len(part) == per_message or blocks + len(o[4]) > blocks_per_message):
            parts.append(part)
            part, blocks = [], 0
        part.append(o)
        blocks += len(o[4])
    if part:
        parts.append(part)
    return parts


def _valid(raw: Any) -> Outcome | None:
    if not isinstance(raw, list) or len(raw) != 5:
        return None
    version, replica, prompt, session, blocks = raw
    if not isinstance(version, int) or not isinstance(replica, str) or not isinstance(blocks, list):
        return None
    if prompt is not None and not isinstance(prompt, int):
        return None
    if session is not None and not isinstance(session, int):
        return None
    return (version, replica, prompt, session, blocks)


class Mirror:
    """Applies other processes' routing outcomes to this process's tiers, last writer winning."""

    def __init__(self, affinity: Affinity, pool: ReplicaPool) -> None:
        self._affinity = affinity
        self._pool = pool
        self.stats = MirrorStats()

    def apply_raw(self, raws: Iterable[Any]) -> None:
        """Outcomes as decoded from a message (checked one by one: a bad one is skipped)."""
        self.apply(self._checked(raws))

    def _checked(self, raws: Iterable[Any]) -> Iterator[Outcome]:
        for raw in raws:
            outcome = _valid(raw)
            if outcome is None:
                self.stats.malformed += 1
            else:
                yield outcome

    def apply(self, outcomes: Iterable[Outcome]) -> None:
        """Each outcome into the prompt cache, sessions and prefix history, unless older."""
        aff, pool, stats = self._affinity, self._pool, self.stats
        now = time.monotonic()
        # Versions are wall-clock; the tiers keep monotonic times.
        offset = time.time() - now
        touched: set[str] = set()
        for version, replica, prompt, session, blocks in outcomes:
            if replica not in pool.replicas:
                stats.unknown_replica += 1
                continue
            at = version / 1e6 - offset
            newer = True
            if prompt is not None:
                newer = aff.prompts.put_if_newer(prompt, replica, at, now)
            if session is not None:
                newer = aff.sessions.put_if_newer(session, replica, at, now) and newer
            if blocks:
                aff.prefixes.record_routed(replica, blocks, now)
                if aff.prefixes.mode(replica) == "precise":
                    aff.homes.record(replica, blocks)
                touched.add(replica)
            if newer:
                stats.applied += 1
            else:
                stats.stale += 1
        for name in touched:
            pool[name].cached_blocks = aff.prefixes.blocks(name)

    def apply_map(self, tier: str, pairs: Iterable[tuple[int, str, int]]) -> None:
        """Bootstrap one tier-1 map from Redis: (key, replica, version µs) triples."""
        aff, pool = self._affinity, self._pool
        now = time.monotonic()
        offset = time.time() - now
        target = aff.prompts if tier == "prompts" else aff.sessions
        for key, replica, version in pairs:
            if replica in pool.replicas:
                target.put_if_newer(key, replica, version / 1e6 - offset, now)

    def apply_placements(self, replica: str, blocks: Sequence[int]) -> None:
        """Bootstrap a replica's routing history from Redis (oldest first)."""
        if replica not in self._pool.replicas or not blocks:
            return
        aff = self._affinity
        # record_routed takes a prompt's blocks leading-first (it stores them reversed).
        aff.prefixes.record_routed(replica, blocks[::-1], time.monotonic())
        self._pool[replica].cached_blocks = aff.prefixes.blocks(replica)
