"""Issue 14's "Done when" on the replay's rows: per workload and round, PASS, FAIL or not run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.replay.contenders import DEFAULT, DIRECT

Row = Mapping[str, Any]
HIT_MARGIN = 0.01  # our hit rate may trail the ceiling by this much
MAX_SHARE_RATIO = 1.5  # the busiest replica's request share over the idlest's
CPU_LIMIT = 1.05  # the replicas' CPU seconds behind us over theirs under direct placement


@dataclass(frozen=True, slots=True)
class Check:
    """One check of one workload and round; passed is None when it could not be evaluated."""

    workload: str
    round: int
    name: str
    subject: str
    passed: bool | None
    detail: str

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: "NOT EVALUATED"}[self.passed]

    def line(self) -> str:
        return f"{self.verdict} {self.workload} round {self.round}: {self.name}: {self.detail}"

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


def _hit(me: Row) -> tuple[bool | None, str]:
    hit, ceiling = me.get("hit_rate"), me.get("ceiling")
    if hit is None or ceiling is None:
        return None, "no hit rate or ceiling"
    return hit >= ceiling - HIT_MARGIN, f"{hit:.3f} vs ceiling {ceiling:.3f} (limit -{HIT_MARGIN})"


def _share(me: Row) -> tuple[bool | None, str]:
    ratio, shares = me.get("max_min_share"), me.get("shares")
    if not shares:
        return None, "no request finished on any replica"
    spread = " / ".join(f"{s:.2f}" for s in shares)
    if ratio is None:
        return False, f"a replica served none (shares {spread})"
    return ratio <= MAX_SHARE_RATIO, f"{ratio:.2f} (limit {MAX_SHARE_RATIO}; shares {spread})"


def _cpu(me: Row, direct: Row | None) -> tuple[bool | None, str]:
    if direct is None:
        return None, f"no {DIRECT} row in this round"
    mine, ref = me.get("replica_cpu_s"), direct.get("replica_cpu_s")
    if mine is None or not ref:
        return None, "no CPU figure"
    ratio = mine / ref
    detail = f"{mine:.2f} s vs {ref:.2f} s direct = {ratio:.3f}x (limit {CPU_LIMIT}x)"
    return ratio <= CPU_LIMIT, detail


def evaluate(rows: Sequence[Row], subject: str = DEFAULT) -> list[Check]:
    """Hit rate >= ceiling - 0.01, max/min share <= 1.5, replicas' CPU <= 1.05x direct's."""
    rounds = list(dict.fromkeys((str(r["workload"]), int(r["round"])) for r in rows))
    out: list[Check] = []
    for wl, rnd in rounds:
        here = {str(r["contender"]): r for r in rows if (r["workload"], r["round"]) == (wl, rnd)}
        me = here.get(subject)
        direct = here.get(DIRECT)
        direct = direct if direct is not None and direct.get("status") == "ok" else None
        names = ("hit rate >= ceiling - 0.01", "max/min request share <= 1.5",
                 "replicas' CPU <= 1.05x direct")  # fmt: skip
        if me is None or me.get("status") != "ok":
            why = "not in this run" if me is None else f"{me.get('status')}: {me.get('reason')}"
            out += [Check(wl, rnd, n, subject, None, f"{subject} {why}") for n in names]
            continue
        results = (_hit(me), _share(me), _cpu(me, direct))
        out += [Check(wl, rnd, n, subject, p, d) for n, (p, d) in zip(names, results, strict=True)]
    return out


def all_passed(checks: Sequence[Check]) -> bool:
    return bool(checks) and all(c.passed for c in checks)
