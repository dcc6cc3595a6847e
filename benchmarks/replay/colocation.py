"""How requests met on replicas during a replay: busy replicas and requests per busy replica."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from benchmarks.replay.loop import Record


def colocation(records: Sequence[Record]) -> dict[str, float | None]:
    """Time-weighted means over the time at least one request ran (client-side send to end).

    `busy_replicas`: replicas with at least one request running; `per_busy_replica`: requests
    running over busy replicas (1.0: never two on one replica). None when a record does not
    say where it ran (a peer router), or nothing ran.
    """
    none: dict[str, float | None] = {"busy_replicas": None, "per_busy_replica": None}
    spans: list[tuple[float, float, int]] = []
    for r in records:
        s, e, w = r.get("sent"), r.get("ended"), r.get("replica")
        if s is None or e is None or w is None:
            return none
        spans.append((float(s), float(e), int(w)))
    if not spans:
        return none
    # +1 at a send, -1 at an end; ends first at equal times (a slot handed straight on).
    events = sorted([(s, 1, w) for s, _, w in spans] + [(e, -1, w) for _, e, w in spans])
    running: Counter[int] = Counter()
    busy_t = replicas_t = requests_t = 0.0
    last = events[0][0]
    for t, step, where in events:
        dt = t - last
        if running and dt > 0:
            busy_t += dt
            replicas_t += dt * len(running)
            requests_t += dt * sum(running.values())
        last = t
        running[where] += step
        if running[where] <= 0:
            del running[where]
    if busy_t <= 0:
        return none
    return {
        "busy_replicas": round(replicas_t / busy_t, 3),
        "per_busy_replica": round(requests_t / replicas_t, 3),
    }
