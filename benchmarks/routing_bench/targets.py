"""The issue's targets, evaluated on result rows with pass/fail and margins."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Row = Mapping[str, Any]
DEFAULT = "gateway:default"
ROUND_ROBIN = "gateway:round_robin"
PRECISE = "gateway:precise"
SKEWED = "skewed_prefix"
MIN_SUCCESS = 0.99


@dataclass(frozen=True, slots=True)
class Target:
    """One target: value vs limit x reference; passed is None when it could not be evaluated."""

    name: str
    workload: str
    offered_qps: float | None
    value: float | None
    reference: float | None
    reference_from: str
    limit: float  # the bound on value / reference
    higher_is_better: bool
    passed: bool | None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.reference:
            return None
        return self.value / self.reference

    def describe(self) -> str:
        if self.passed is None:
            return f"not evaluated: {self.note}"
        r = self.ratio
        assert r is not None
        op = ">=" if self.higher_is_better else "<="
        margin = (r / self.limit - 1.0) if self.higher_is_better else (1.0 - r / self.limit)
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"{verdict}: {r:.2f}x {self.reference_from} (target {op} {self.limit:g}x, "
            f"margin {margin:+.0%})"
        )


def _ok_rows(rows: Sequence[Row], workload: str) -> list[Row]:
    return [r for r in rows if r.get("workload") == workload and r.get("status") == "ok"]


def top_load(rows: Sequence[Row], workload: str) -> float | None:
    """The highest offered load at which any contender kept >= 99% success."""
    loads = [
        float(r["offered_qps"])
        for r in _ok_rows(rows, workload)
        if (r.get("success_rate") or 0.0) >= MIN_SUCCESS
    ]
    return max(loads) if loads else None


def _at(rows: Sequence[Row], workload: str, qps: float) -> dict[str, Row]:
    return {str(r["contender"]): r for r in _ok_rows(rows, workload) if r["offered_qps"] == qps}


def is_ours(name: str) -> bool:
    return name.startswith("gateway:")


def _compare(
    name: str,
    workload: str,
    rows: Sequence[Row],
    metric: str,
    subject: str,
    reference: Callable[[dict[str, Row]], tuple[str, float | None]],
    limit: float,
    higher_is_better: bool,
) -> Target:
    qps = top_load(rows, workload)
    if qps is None:
        ran = any(r.get("workload") == workload and r.get("status") == "ok" for r in rows)
        note = "no contender kept >= 99% success at any load" if ran else "workload not in this run"
        return Target(name, workload, None, None, None, "", limit, higher_is_better, None, note)
    at = _at(rows, workload, qps)
    ref_name, ref = reference(at)
    row = at.get(subject)
    value = None if row is None else row.get(metric)

    def verdict(passed: bool | None, note: str = "") -> Target:
        return Target(
            name, workload, qps, value, ref, ref_name, limit, higher_is_better, passed, note
        )

    if value is None or ref is None or ref_name == "":
        missing = subject if value is None else (ref_name or "a reference contender")
        return verdict(None, f"no {metric} from {missing} at {qps:g} req/s")
    if ref == 0:
        return verdict(value >= 0 if higher_is_better else value <= 0, "reference is 0")
    ratio = value / ref
    return verdict(ratio >= limit if higher_is_better else ratio <= limit)


def _best(
    metric: str, pick: Callable[[str], bool], higher: bool
) -> Callable[[dict[str, Row]], tuple[str, float | None]]:
    def ref(at: dict[str, Row]) -> tuple[str, float | None]:
        cands = [(n, r[metric]) for n, r in at.items() if pick(n) and r.get(metric) is not None]
        if not cands:
            return "", None
        n, v = (max if higher else min)(cands, key=lambda c: c[1])
        return n, float(v)

    return ref


def _named(metric: str, who: str) -> Callable[[dict[str, Row]], tuple[str, float | None]]:
    def ref(at: dict[str, Row]) -> tuple[str, float | None]:
        r = at.get(who)
        return (who, r.get(metric)) if r is not None else ("", None)

    return ref


def _versus_peers(tag: str, workload: str, rows: Sequence[Row]) -> list[Target]:
    """Default's TTFT p90 <= 0.5x and output >= 1.2x the best peer's, on one workload."""
    not_ours = lambda n: not is_ours(n)  # noqa: E731
    return [
        _compare(
            f"{tag}default TTFT p90 <= 0.5x best peer",
            workload,
            rows,
            "ttft_p90_s",
            DEFAULT,
            _best("ttft_p90_s", not_ours, False),
            0.5,
            False,
        ),
        _compare(
            f"{tag}default output tok/s >= 1.2x best peer",
            workload,
            rows,
            "output_tok_s",
            DEFAULT,
            _best("output_tok_s", not_ours, True),
            1.2,
            True,
        ),
    ]


def evaluate(rows: Sequence[Row]) -> list[Target]:
    """Every target of the issue, on the shared-prefix and low-sharing workloads.

    The same peer comparisons on skewed_prefix follow when it ran (not the issue's targets:
    its shared-prefix groups are equally popular).
    """
    sp, ls = "shared_prefix", "low_sharing"
    ours = lambda n: is_ours(n) and n != PRECISE  # noqa: E731
    return [
        *_versus_peers("", sp, rows),
        _compare(
            "default hit rate >= 1.5x round-robin",
            sp,
            rows,
            "hit_rate",
            DEFAULT,
            _named("hit_rate", ROUND_ROBIN),
            1.5,
            True,
        ),
        _compare(
            "low-sharing: default TTFT p90 within 5% of round-robin",
            ls,
            rows,
            "ttft_p90_s",
            DEFAULT,
            _named("ttft_p90_s", ROUND_ROBIN),
            1.05,
            False,
        ),
        _compare(
            "low-sharing: default output tok/s within 5% of round-robin",
            ls,
            rows,
            "output_tok_s",
            DEFAULT,
            _named("output_tok_s", ROUND_ROBIN),
            0.95,
            True,
        ),
        _compare(
            "precise TTFT p90 within 10% of our best profile",
            sp,
            rows,
            "ttft_p90_s",
            PRECISE,
            _best("ttft_p90_s", ours, False),
            1.1,
            False,
        ),
        _compare(
            "precise output tok/s within 10% of our best profile",
            sp,
            rows,
            "output_tok_s",
            PRECISE,
            _best("output_tok_s", ours, True),
            0.9,
            True,
        ),
        *(_versus_peers("skewed: ", SKEWED, rows) if _ok_rows(rows, SKEWED) else ()),
    ]


def best_profile(
    rows: Sequence[Row], loads: Mapping[str, float] | None = None
) -> tuple[str | None, dict[str, float]]:
    """Our profile with the lowest mean TTFT p90 relative to the best of ours, over workloads.

    Each workload counts at its highest load where any contender kept >= 99% success (or at
    `loads[workload]`); a profile missing a figure there gets the worst ratio seen, so gaps
    never help.
    """
    scores: dict[str, list[float]] = {}
    workloads = sorted({str(r["workload"]) for r in rows})
    for wl in workloads:
        qps = loads.get(wl) if loads is not None else top_load(rows, wl)
        if qps is None:
            continue
        at = {n: r for n, r in _at(rows, wl, qps).items() if is_ours(n)}
        vals = {n: r.get("ttft_p90_s") for n, r in at.items()}
        known = [v for v in vals.values() if v]
        if not known:
            continue
        best = min(known)
        worst = max(known) / best
        for n, v in vals.items():
            scores.setdefault(n, []).append(v / best if v else worst)
    mean = {n: sum(v) / len(v) for n, v in scores.items()}
    return (min(mean, key=lambda n: mean[n]) if mean else None), mean


def best_by_seed(
    rows: Sequence[Row], seed_rows: Sequence[Row]
) -> dict[int, tuple[str | None, dict[str, float]]]:
    """`best_profile` on each seed alone, at the loads the folded rows are judged at.

    A workload that ran on fewer seeds counts with its first seed's rows in every seed, so
    each seed's ranking covers every workload; only the repeated ones vary.
    """
    loads = {wl: q for wl in {str(r["workload"]) for r in rows} if (q := top_load(rows, wl))}
    ok = [r for r in seed_rows if r.get("status") == "ok" and isinstance(r.get("seed"), int)]
    seeds = sorted({int(r["seed"]) for r in ok})
    ran: dict[str, set[int]] = {}
    for r in ok:
        ran.setdefault(str(r["workload"]), set()).add(int(r["seed"]))
    out: dict[int, tuple[str | None, dict[str, float]]] = {}
    for s in seeds:
        use = {wl: s if s in got else min(got) for wl, got in ran.items()}
        out[s] = best_profile([r for r in ok if int(r["seed"]) == use[str(r["workload"])]], loads)
    return out
