"""The fault suite's report.md and results.json."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _kinds(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def markdown(results: Mapping[str, Any]) -> str:
    """The report: the figures, the checks, the timeline, the configuration under test."""
    meta, s, sl = results["meta"], results["summary"], results["slowloris"]
    p = results["parameters"]
    load = p["load"]
    rss = s["rss_mib"]
    lines = [
        "# Fault suite (simulated fleet)",
        "",
        f"`{meta['command']}` on {meta['date']}; machine: {meta['machine']['cpu_model']}, "
        f"{meta['machine']['cpus_usable']} usable CPUs, load average at start "
        f"{', '.join(f'{x:.2f}' for x in meta['machine']['loadavg_at_start'])}.",
        "",
        f"{load['concurrency']} closed-loop clients for {load['duration_s']:g} s "
        f"({results['load_s']:g} s with the last requests' ends) through one `llm-gateway serve` "
        f"in front of {p['replicas']} simulated replicas, one process each; "
        f"{p['slowloris_connections']} slowloris connections throughout; whole run "
        f"{results['wall_s']:g} s. Each request has a {load['deadline_s']:g} s deadline (past "
        f"it: a hang, lost); {load['cancel_share']:.0%} of the streams leave on purpose "
        f"mid-stream, {load['unary_share']:.0%} of the requests are not streamed.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests sent | {s['sent']} |",
        f"| completed (`[DONE]`, or a whole answer) | {s['completed']} |",
        f"| retried (gateway `llm_gateway_upstream_retries_total`) | {s['retried']} "
        f"({_kinds(s['retries_by_reason'])}) |",
        f"| retries refused by the budget | {s['retries_refused']} |",
        f"| failed with a clear error | {s['errors']} ({_kinds(s['errors_by_kind'])}) |",
        f"| client-cancelled | {s['cancelled']} |",
        f"| **lost** | **{s['lost']}** ({_kinds(s['lost_by_kind'])}) |",
        f"| counts match (completed + errors + cancelled + lost = sent) | {s['counts_match']} |",
        f"| longest request | {s['longest_request_s']:g} s |",
        f"| gateway's own count of answers (`llm_gateway_requests_total`) | "
        f"{s['gateway_answered']} ({_kinds(s['gateway_answered_by_status'])}) |",
        f"| streams the gateway truncated (SSE error event) | {s['streams_truncated']} |",
        f"| ejections | {_kinds(s['ejections_by_reason'])} |",
        f"| in flight at end / queued at end | {s['in_flight_at_end']} / {s['queued_at_end']} "
        f"(settled in {s['settled_in_s']:g} s) |",
        f"| gateway RSS before / peak / after | {rss['before']:g} / {rss['peak']:g} / "
        f"{rss['after']:g} MiB |",
        f"| slowloris | {sl['connections_opened']} connections opened, answered "
        f"{_kinds(sl['answered_by_status'])}, {sl['closed_without_answer']} closed without an "
        f"answer, median {sl['median_open_s']} s open, longest {sl['longest_open_s']:g} s; "
        f"{sl['open_at_end']} open when the attack stopped (oldest {sl['oldest_at_end_s']:g} s); "
        f"{sl['refused']} refused |",
        "",
        "## Checks",
        "",
        "| check | value | bound | passed |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {c['check']} | {c['value']} | {c['bound']} | {'yes' if c['passed'] else '**NO**'} |"
        for c in results["checks"]
    ]
    lines += [
        "",
        "## Fault timeline",
        "",
        "Seconds since the load started. Each fault holds for 0.8 of its window, then a clean gap.",
        "",
        "| at (s) | fault | replica | step |",
        "|---|---|---|---|",
    ]
    for e in results["timeline"]:
        what = e["what"] + (f" (**failed**: {e['error']})" if "error" in e else "")
        lines.append(f"| {e['at_s']:g} | {e['fault']} | {e['replica']} | {what} |")
    lines += ["", "What each fault should cause:", ""]
    lines += [f"- `{f['name']}` ({f['replica']}): {f['expect']}" for f in results["faults"]]
    lines += [
        "",
        "## Configuration under test",
        "",
        "The gateway's defaults, but for timeouts and ejections a three-minute run can exercise:",
        "",
        "```toml",
        results["gateway_toml"].split("[[replicas]]", 1)[0].rstrip(),
        "```",
        "",
        f"Simulated replicas: {p['sim']}.",
        "",
    ]
    return "\n".join(lines)


def write_outputs(results: Mapping[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    (out / "report.md").write_text(markdown(results))
