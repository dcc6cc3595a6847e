"""results.json and report.md of a replay: every round and contender, then the checks."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.replay.checks import Check

Row = Mapping[str, Any]
# Every ok row carries these (None where a figure could not be had); results.json fills them
# on the other rows too, so a reader needs no key checks.
FIELDS = (
    "contender", "workload", "round", "status", "reason", "requests", "succeeded", "wall_s",
    "ttft_p50_s", "ttft_p90_s", "e2e_p50_s", "replica_requests", "shares", "max_min_share",
    "idle_replicas", "hit_rate", "ceiling", "ceiling_as_sent", "cached_token_rate",
    "replica_cpu_s", "cpu_vs_direct", "contender_cpu_s", "client_cpu_s", "others_cpu_s",
    "preemptions", "errors", "probes", "ready_s", "busy_replicas", "per_busy_replica",
)  # fmt: skip


def _f(v: Any, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def write_results(
    path: Path, meta: Mapping[str, Any], rows: Sequence[Row], checks: Sequence[Check]
) -> None:
    """{"meta", "rows", "checks"}: every field on every row (None where it has no value)."""
    full = [{**dict.fromkeys(FIELDS), **r} for r in rows]
    data = {"meta": meta, "rows": full, "checks": [c.as_json() for c in checks]}
    path.write_text(json.dumps(data, indent=1) + "\n")


def _header(meta: Mapping[str, Any]) -> list[str]:
    m = meta.get("machine", {})
    v = meta.get("versions", {})
    fleet = meta.get("fleet", {})
    simulated = fleet.get("kind") == "sim"
    lines = [
        "# Closed-loop replay (`llm-gateway bench replay`)",
        "",
        f"- date: {meta.get('date')}; wall time of the whole run {meta.get('wall_s')} s",
        f"- command: `{meta.get('command')}`",
        f"- machine: {m.get('cpu_model')}, {m.get('cpus_usable')} usable cores, load average "
        f"at start {' '.join(f'{x:.2f}' for x in m.get('loadavg_at_start') or [])}, "
        f"{m.get('platform')}",
        "- versions: " + ", ".join(f"{k} {x}" for k, x in v.items()),
        f"- fleet: {fleet.get('kind')}, {fleet.get('replicas')} replicas, model "
        f"`{fleet.get('model')}`, block size {fleet.get('block_size')} tokens"
        + (" (SIMULATED replicas: CPU figures are the simulator's)" if simulated else ""),
        f"- rounds (each the workload generated from that seed): {meta.get('rounds')}; "
        f"{meta.get('in_flight')} requests in flight; {meta.get('max_tokens')} output tokens "
        "each (ignore_eos); streamed",
        f"- contenders, in the order they ran each round: {', '.join(meta.get('contenders', []))}",
        "- caches reset (`/reset_prefix_cache`) and the contender started fresh before every "
        "replay; the same fleet serves every contender of a workload",
        "",
    ]
    for name, w in meta.get("workloads", {}).items():
        kv = w.get("kv", {})
        sizes = ", ".join(f"{k} {x}" for k, x in w.get("params", {}).items())
        per_round = w.get("requests_per_round", {})
        ceilings = w.get("ceiling_per_round", {})
        lines.append(
            f"- **{name}** ({sizes}): {', '.join(map(str, per_round.values()))} requests per "
            "round; KV "
            f"sized from it: working set {kv.get('working_set_blocks')} blocks "
            f"({kv.get('working_set_tokens')} tokens) = {kv.get('working_set_vs_fleet_kv')} of "
            f"{kv.get('replicas')} x {kv.get('blocks_per_replica')} blocks (target "
            f"{kv.get('target_fraction')}); context {w.get('max_model_len')}; longest prompt "
            f"{w.get('longest_prompt_tokens')} tokens; hit-rate ceiling "
            + ", ".join(f"{_f(c, '.3f')} (round {r})" for r, c in ceilings.items())
        )
    return lines


_COLUMNS = (
    ("round", "round", "d"), ("contender", "contender", "s"), ("wall s", "wall_s", ".2f"),
    ("TTFT p50 s", "ttft_p50_s", ".3f"), ("TTFT p90 s", "ttft_p90_s", ".3f"),
    ("hit rate", "hit_rate", ".3f"), ("ceiling", "ceiling", ".3f"),
    ("max/min share", "max_min_share", ".2f"), ("replicas' CPU s", "replica_cpu_s", ".2f"),
    ("vs direct", "cpu_vs_direct", ".3f"), ("router CPU s", "contender_cpu_s", ".2f"),
    ("others' CPU s", "others_cpu_s", ".1f"), ("busy replicas", "busy_replicas", ".2f"),
    ("per busy replica", "per_busy_replica", ".2f"),
)  # fmt: skip


def _table(rows: Sequence[Row]) -> list[str]:
    head = [c[0] for c in _COLUMNS] + ["ok / sent", "shares per replica", "notes"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [_f(r.get(k), f) for _, k, f in _COLUMNS]
        if r.get("status") != "ok":
            cells += ["—", "—", f"{str(r.get('status')).upper()}: {r.get('reason')}"]
        else:
            shares = " / ".join(f"{s:.2f}" for s in r.get("shares") or [])
            notes = [f"{k} x{n}" for k, n in (r.get("errors") or {}).items()]
            if r.get("preemptions"):
                notes.append(f"{r['preemptions']} preemptions")
            if (r.get("probes") or 0) > 1:
                notes.append(f"answered probe {r['probes']} after {r.get('ready_s')} s")
            sent = f"{r.get('succeeded')} / {r.get('requests')}"
            cells += [sent, shares or "—", "; ".join(notes)]
        out.append("| " + " | ".join(cells) + " |")
    return out


_HOW = """## How it was measured

Closed loop: exactly `in_flight` requests run at a time, a pool of workers each taking the
next ready request the moment its previous one ends; a conversation's next turn is ready only
once its previous answer has ended. `direct` sends a request straight to replica
`group mod N` (long_prefixes) or `user mod N` (multi_round_chat): the ceiling's placement.
`placed:X` sends each request straight to the replica `gateway:X` chose for it earlier in the
same round (from the gateway's request log): the same placement without the relay and the
gateway's observation of the replicas.
Busy replicas: the time-weighted mean number of replicas running at least one of the replay's
requests (client-side send to end), over the time any ran; per busy replica: requests running
over busy replicas (1.00: never two together). Where replicas share CPU cores (more replicas
than cores), work spread over more busy replicas batches less and contends more, so wall time
and CPU seconds depend on how requests meet, not only on how many each replica got.
Wall time: first send to last answer. Hit rate: the replicas' own
`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`, deltas over the replay summed
over replicas. Shares: each replica's delta of `vllm:request_success_total` (summed over its
labels) over the fleet's. Ceiling: the same prompts in replay order with the fleet's tokenizer
and chat template, a full block counting as hit when its whole block chain was in an earlier
prompt, the block holding a prompt's last token never, over all prompt tokens (`ceiling_as_sent`
in results.json: the same in the order this contender actually sent them). CPU: user + system
seconds from `/proc` of every replica process and its descendants (a vLLM replica's engine
core) over the replay; `vs direct`: over `direct`'s in the same round; `router CPU`: the
contender's own processes; `others' CPU`: the rest of the machine (a shared machine: a large
figure means the row was measured while something else ran).
"""


def render_markdown(meta: Mapping[str, Any], rows: Sequence[Row], checks: Sequence[Check]) -> str:
    lines = _header(meta)
    lines += ["", "## Done when (issue 14), for " + f"`{meta.get('subject')}`", ""]
    lines += ["```", *(c.line() for c in checks), "```"] if checks else ["(no checks)"]
    for wl in dict.fromkeys(str(r["workload"]) for r in rows):
        lines += ["", f"## {wl}", "", *_table([r for r in rows if r["workload"] == wl])]
    lines += ["", _HOW]
    return "\n".join(lines)


def write_report(
    out: Path, meta: Mapping[str, Any], rows: Sequence[Row], checks: Sequence[Check]
) -> Path:
    """results.json, then report.md; return the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    write_results(out / "results.json", meta, rows, checks)
    path = out / "report.md"
    path.write_text(render_markdown(meta, rows, checks))
    return path
