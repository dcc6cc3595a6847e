"""`llm-gateway bench faults`: nothing lost while replicas fail, one dies, clients misbehave.

Processes: one simulated replica per process (`python -m simulator --replicas 1`, so one can be
SIGKILLed and restarted on its port), one `llm-gateway serve` (benchmarks/faults/suite.py has
its configuration: the defaults but for timeouts and ejections short enough for the run), and
this process: `--streams` closed-loop clients (clients.py; each request with a deadline, some
leaving mid-stream on purpose, a few not streamed), a slowloris attacker trickling request
heads on `--slowloris` connections, and the fault timeline (timeline.py: every fault the
simulator offers, one replica after another, and a SIGKILL). At the end the gateway's
/metrics must show nothing in flight or queued, and its RSS (/proc/<pid>/status) is compared.

results.json:
- `meta`: date, command, machine. `parameters`: Params of suite.py (load, sim, timeouts).
- `faults`: the plan (name, replica, action, patch, expect); `timeline`: what was done when
  (`at_s` since the load began, `what`, an `error` where a step failed).
- `summary`: sent, completed, errors (+ `errors_by_kind`: `http_<status>` or `sse_<code>`),
  cancelled, lost (+ `lost_by_kind`: hang, truncated, transport:<exception>, unclear_...,
  no_record), counts_match, longest_request_s; from the gateway's metrics (deltas over the
  load): retried and retries_by_reason, retries_refused, ejections_by_reason,
  streams_truncated, gateway_answered(_by_status); in_flight_at_end, queued_at_end,
  settled_in_s; rss_mib before / peak / after; gateway_alive_at_end.
- `slowloris`: connections opened / refused, answered_by_status, closed_without_answer,
  ended_by_gateway, median_open_s, open_at_end, oldest_at_end_s, longest_open_s.
- `checks`: check, value, bound, passed. The command exits 1 when any fails (a lost request,
  in-flight or queue not back to 0, the gateway gone or its own count of answered requests
  not the number sent, RSS growth past its bound, a slowloris
  connection held past header_timeout_s + 5 s, a fault step that failed).

`--fleet vllm-cpu` (vllm_suite.py, vllm_observe.py, vllm_report.py) runs on real vLLM CPU
replicas instead: one fleet, and per phase (`--modes on,off`: the gateway's retries and
passive ejection on, or both off) an in-process gateway, `--streams` clients, a SIGKILL of the
last replica's process group at `--kill-at` s, its restart on its ports, `--after-return` s of
load on it again. Its results.json has, per phase: the client summary, when and by which rule
the replica was ejected, attempts routed to it while unroutable, its share per 10 s window
after its return, retries in flight against the retry budget, in flight at the end, and the
gateway's per-replica counts beside vLLM's own `vllm:request_success_total`.
"""
