"""`bench tenants`' verdicts and report.md (benchmarks/tenants.py measures)."""

from __future__ import annotations

from typing import Any


def checks(iso: dict[str, Any], prio: dict[str, Any]) -> list[dict[str, Any]]:
    a_errors = sum(ph["a"]["errors"] for ph in iso["phases"])
    refused = sum(iso["b_quota_refusals"].values())
    median = prio["median_wait_slots"]
    rows = [
        ("A's TTFT p90 with B / alone", iso["p90_ratio"], "<= 1.10",
         iso["p90_ratio"] is not None and iso["p90_ratio"] <= 1.10),
        ("A's requests all complete", a_errors, "== 0 errors", a_errors == 0),
        ("B refused over its quota", refused, "> 0", refused > 0),
        ("P0 median wait (dispatch slots)", median, "<= 1", median is not None and median <= 1),
        ("P2 dispatched ahead of a P0 (max)", prio["max_p2_ahead"], "<= 1",
         prio["max_p2_ahead"] is not None and prio["max_p2_ahead"] <= 1),
        ("probes all complete", sum(r["status"] != 200 for r in prio["probes"]), "== 0 failed",
         all(r["status"] == 200 for r in prio["probes"])),
    ]  # fmt: skip
    return [{"check": c, "value": v, "bound": b, "passed": ok} for c, v, b, ok in rows]


def markdown(r: dict[str, Any]) -> str:
    iso, prio, p, m = r["isolation"], r["priority"], r["parameters"], r["meta"]
    out = ["# Tenants: isolation under a greedy tenant, P0 under a P2 flood (simulated fleet)", "",
           f"`{m['command']}` on {m['date']}; {m['machine']['cpus_usable']} usable CPUs, load "
           f"average at start {m['machine']['loadavg_at_start'][0]:.2f}; {r['wall_s']:g} s.", "",
           "## A greedy tenant", "",
           f"{p['replicas']} simulated replicas, default profile. A: {p['a_rate']:g} streams/s "
           f"(Poisson, {p['prompt_words']}-word prompts, {p['max_tokens']} tokens). B: quota "
           f"{p['b_rpm']} requests/min and {p['b_max_concurrent']} concurrent, sending "
           f"{iso['b_rate']:g} streams/s (10x its per-minute quota). {p['phase_s']:g} s phases, "
           "interleaved. TTFT: send to the first SSE event, completed streams.", "",
           "| phase | A sent | A ok | A TTFT p50 (s) | A TTFT p90 (s) | B sent | B ok | B 429 |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for ph in iso["phases"]:
        a, b = ph["a"], ph.get("b")
        bcols = f"{b['sent']} | {b['ok']} | {b['refused_by_limit']}" if b else "- | - | -"
        out.append(f"| {ph['phase']} | {a['sent']} | {a['ok']} | {a['ttft_p50_s']} | "
                   f"{a['ttft_p90_s']} | {bcols} |")  # fmt: skip
    out += ["", f"A's TTFT p90: alone {iso['a_alone_p90_s']} s, beside B {iso['a_with_b_p90_s']} s"
            f" (x{iso['p90_ratio']}); p50 {iso['a_alone']['ttft_p50_s']} s and "
            f"{iso['a_with_b']['ttft_p50_s']} s. The gateway's quota refusals of B: "
            f"{iso['b_quota_refusals']}.", "", "## P0 under a P2 flood", "",
            f"{prio['slots']} slots ({p['slots_per_replica']} per replica); the flood keeps "
            f"{p['flood_queue']} P2 requests queued ({prio['flood_requests']} sent, "
            f"{prio['flood_ok']} complete). Unqueued P0 TTFT {prio['unqueued_ttft_s']} s; one "
            f"dispatch slot {prio['dispatch_interval_s']} s. P0 wait in slots: median "
            f"{prio['median_wait_slots']}, max {prio['max_wait_slots']}; P2 requests dispatched "
            f"ahead of a waiting P0: median {prio['median_p2_ahead']}, max "
            f"{prio['max_p2_ahead']} (first-come-first-served: about {p['flood_queue']}).", "",
            "| probe | status | wait (s) | wait (slots) | P2 dispatched ahead |",
            "|---|---|---|---|---|"]  # fmt: skip
    for i, pr in enumerate(prio["probes"]):
        out.append(f"| {i} | {pr['status']} | {pr['wait_s']} | {pr.get('wait_slots')} | "
                   f"{pr.get('p2_ahead')} |")  # fmt: skip
    out += ["", "## Checks", "", "| check | value | bound | passed |", "|---|---|---|---|"]
    out += [f"| {c['check']} | {c['value']} | {c['bound']} | {'yes' if c['passed'] else '**NO**'} |"
            for c in r["checks"]]  # fmt: skip
    return "\n".join([*out, ""])
