"""The real-vLLM fault run's report.md and results.json."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _phase(ph: Mapping[str, Any]) -> list[str]:
    s, e, b, m = ph["summary"], ph["ejection"], ph["retry_budget"], ph["marks_s"]
    lines = [
        f"## Phase `{ph['mode']}` (victim {ph['victim']})",
        "",
        f"SIGKILL at {m['kill']:g} s, restart at {m['restart']:g} s (vLLM healthy after "
        f"{m['vllm_start_s']:g} s), routable at the gateway at {m['routable_again']:g} s, "
        f"load ended at {m['load_end']:g} s.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| sent / completed / clear errors / lost | {s['sent']} / {s['completed']} / "
        f"{s['errors']} / **{s['lost']}** |",
        f"| errors by kind | {s['errors_by_kind'] or 'none'} |",
        f"| lost by kind | {s['lost_by_kind'] or 'none'} |",
        f"| errors ended after the kill (s) | {s['errors_ended_after_kill_s']} |",
        # The gateway's retries counter counts every attempt abandoned before its first byte,
        # the ones then refused by the budget or past max_retries included.
        f"| attempts abandoned before the first byte (`llm_gateway_upstream_retries_total`) / "
        f"retries refused by the budget | {s['retried']} / {s['retries_refused']} |",
        f"| SIGKILL to process exit | {e['exited_after_kill_s']} s |",
        f"| ejected after the kill | {e['ejected_after_kill_s']} s, rule {e['rule']} |",
        f"| health checks: down after the kill | {e['health_down_after_kill_s']} s |",
        f"| attempts to the victim: kill to unroutable / while unroutable / after return | "
        f"{e['attempts_to_victim_kill_to_unroutable']} / "
        f"{e['attempts_to_victim_while_unroutable']} / {e['attempts_to_victim_after_return']} |",
        f"| retries in flight: peak (active, bound there) / samples over the bound | "
        f"{b['peak_retries_in_flight']} ({b['active_at_peak']}, {b['bound_at_peak']:g}) / "
        f"{b['samples_over_bound']} of {b['samples']} (over {b['sampled_s']:g} s) |",
        f"| in flight / queued at the end | {ph['in_flight_at_end']} / {ph['queued_at_end']} "
        f"(settled in {ph['in_flight_settled_in_s']:g} s) |",
        "",
        "Victim's share of attempts per window, before the kill and from its return:",
        "",
        "| window (s) | attempts | to the victim | share | admit fraction at start |",
        "|---|---|---|---|---|",
    ]
    for label, rows in (("before kill", ph["share_before_kill"]), ("return", ph["ramp_windows"])):
        lines += [
            f"| {label} +{w['from_s']:g}..{w['to_s']:g} | {w['attempts']} | {w['to_replica']} | "
            f"{w['share']:.3f} | {w['admit_fraction_at_start']:g} |"
            for w in rows
        ]
    lines += ["", "Answers served, gateway vs vLLM `request_success_total`:", ""]
    lines += [f"- `{json.dumps(a)}`" for a in ph["agreement"]]
    lines += ["", "| check | value | bound | passed |", "|---|---|---|---|"]
    lines += [
        f"| {c['check']} | {c['value']} | {c['bound']} | {'yes' if c['passed'] else '**NO**'} |"
        for c in ph["checks"]
    ]
    return [*lines, ""]


def markdown(results: Mapping[str, Any]) -> str:
    meta, p = results["meta"], results["parameters"]
    lines = [
        "# Fault run on real vLLM (CPU)",
        "",
        f"`{meta['command']}` on {meta['date']}; {meta['machine']['cpu_model']}, "
        f"{meta['machine']['cpus_usable']} usable CPUs. {p['replicas']} replicas of "
        f"{results['fleet']['model']} (started in {results['fleet']['start_s']:g} s), "
        f"{p['load']['concurrency']} clients; whole run {results['wall_s']:g} s.",
        "",
    ]
    for ph in results["phases"]:
        lines += _phase(ph)
    return "\n".join(lines)


def write_vllm_outputs(results: Mapping[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "report.md").write_text(markdown(results))


def compare(phases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per phase: what the clients saw."""
    return [
        {
            "mode": ph["mode"],
            "sent": ph["summary"]["sent"],
            "completed": ph["summary"]["completed"],
            "errors": ph["summary"]["errors"],
            "errors_by_kind": ph["summary"]["errors_by_kind"],
            "lost": ph["summary"]["lost"],
            "retried": ph["summary"]["retried"],
        }
        for ph in phases
    ]
