"""The wrk/nginx overhead harness: nginx's config and replies, wrk's script and output, the maths,
and one short real run (wrk -> gateway -> nginx)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from benchmarks import overhead
from benchmarks.nginx_upstream import EVENT_BYTES, nginx_config, padded_stream
from benchmarks.overhead_procs import cpu_seconds, runqueue_wait_s
from benchmarks.overhead_wrk import gateway_toml, parse_gateway
from benchmarks.overhead_wrk_report import DIRECT, WrkRound, build_rows, evaluate_targets
from benchmarks.wrk_load import WrkError, WrkResult, lua_script, parse_output
from gateway.config import load_config
from tests.system_programs import program

REPO = Path(__file__).resolve().parents[2]


def test_nginx_config_is_one_quiet_process_sending_one_event_per_write(tmp_path: Path) -> None:
    conf = nginx_config(tmp_path, "127.0.0.1", 8001, 8002)
    for line in (
        "daemon off;",
        "master_process off;",
        "access_log off;",
        "sendfile off;",
        "postpone_output 0;",
        f"output_buffers 1 {EVENT_BYTES};",
    ):
        assert line in conf
    assert "listen 127.0.0.1:8001 " in conf and "listen 127.0.0.1:8002 " in conf
    json_server, stream_server = conf.split("server {")[1:]
    # nginx's static files refuse POST: the error page is the reply.
    assert "error_page 405 =200 /chat;" in json_server
    assert "error_page 405 =200 /stream.sse;" in stream_server
    for path in ("/v1/models", "/metrics", "/health"):
        assert f"location = {path} " in json_server and f"location = {path} " in stream_server
    assert str(tmp_path) in conf  # temp paths and pid under the run's own directory


def test_the_stream_is_equal_sized_events_ending_with_done() -> None:
    data = padded_stream(6)
    assert len(data) == 7 * EVENT_BYTES
    events = [data[i : i + EVENT_BYTES] for i in range(0, len(data), EVENT_BYTES)]
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in events)
    assert all(e.count(b"\n\n") == 1 for e in events)
    chunks = [orjson.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1].rstrip() == b"data: [DONE]"


def _lua_bytes(literal: str) -> bytes:
    return bytes(int(n) for n in re.findall(r"\\(\d+)", literal))


def test_the_lua_script_posts_the_body_and_reports_json() -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"a \\"q\\"\\n"}]}'
    script = lua_script(body, {"x-api-key": "k"})
    assert 'wrk.method = "POST"' in script
    (literal,) = re.findall(r'^wrk\.body = (".*")$', script, re.M)
    assert _lua_bytes(literal) == body
    headers = dict(
        (_lua_bytes(k), _lua_bytes(v))
        for k, v in re.findall(r'^wrk\.headers\[(".*?")\] = (".*")$', script, re.M)
    )
    assert headers == {b"content-type": b"application/json", b"x-api-key": b"k"}
    assert "function done(summary, latency, requests)" in script
    assert "latency:percentile(99)" in script and "WRKJSON " in script


WRK_STDOUT = """Running 2s test @ http://127.0.0.1:9/v1/chat/completions
  1 threads and 64 connections
WRKJSON {"requests":8000,"duration_us":2000000,"bytes":4000000,"connect":0,"read":1,\
"write":0,"status":2,"timeout":0,"p50_us":1500,"p90_us":2500,"p99_us":9000,"max_us":12000,\
"mean_us":1600.5}
"""


def test_wrk_output_is_read_from_its_json_line() -> None:
    r = parse_output(WRK_STDOUT)
    assert r.requests == 8000 and r.errors == 3
    assert r.rps == 4000.0
    assert (r.p50_s, r.p90_s, r.p99_s, r.max_s) == (0.0015, 0.0025, 0.009, 0.012)
    with pytest.raises(WrkError, match="no WRKJSON line"):
        parse_output("Running 2s test\n  1 threads and 1 connections\n")
    with pytest.raises(WrkError, match="bad wrk result line"):
        parse_output("WRKJSON {not json")


def _round(target: str, conc: int, stream: bool, index: int, rps: float, p50_ms: float,
           cpu_s: float, p99_ms: float = 10.0) -> WrkRound:  # fmt: skip
    requests = int(rps * 2)
    wrk = WrkResult(requests, 2.0, 0, p50_ms / 1e3, p50_ms / 1e3, p99_ms / 1e3, 0.05, 0.001, 0)
    return WrkRound(target, conc, stream, index, wrk, cpu_s, 0.1, 0.2, 0.0, wait_s=0.5)


def _spinner() -> subprocess.Popen[bytes]:
    """A process spinning on CPU 0 only."""
    code = "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def test_run_queue_wait_counts_threads_that_waited_for_a_core() -> None:
    # Two spinners on one core: while one runs the other waits, so their waits add up to
    # about the CPU time they got together.
    spinners = [_spinner(), _spinner()]
    pids = [s.pid for s in spinners]
    try:
        deadline = time.monotonic() + 30
        while min(cpu_seconds(pid) for pid in pids) < 0.2:
            assert time.monotonic() < deadline, "the spinners got no CPU in 30 s"
            time.sleep(0.02)
        assert runqueue_wait_s(pids) >= 0.2
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    assert runqueue_wait_s(pids) == 0.0  # gone: nothing to read
    assert runqueue_wait_s([os.getpid()]) >= 0.0


def test_rows_pair_each_round_with_its_direct_round_and_targets_judge_them() -> None:
    rounds = [
        _round(DIRECT, 1, False, 0, 10000, 0.1, 0.0),
        _round("gateway", 1, False, 0, 2000, 0.4, 1.0),
        _round(DIRECT, 1, False, 1, 10000, 0.3, 0.0),
        _round("gateway", 1, False, 1, 2000, 0.5, 1.0),
        _round(DIRECT, 64, False, 0, 30000, 2.0, 0.0),
        _round("gateway", 64, False, 0, 4000, 16.0, 1.6, p99_ms=30.0),
        _round("vllm-router:round_robin", 64, False, 0, 15000, 4.0, 0.5, p99_ms=8.0),
        _round(DIRECT, 64, True, 0, 2000, 30.0, 0.0),
        _round("gateway", 64, True, 0, 1900, 31.0, 1.9),
    ]
    rows = build_rows(rounds, chunks=64)
    by = {(r["target"], r["concurrency"], r["stream"]): r for r in rows}
    g1 = by[("gateway", 1, False)]
    # Medians of per-round differences: (0.4 - 0.1, 0.5 - 0.3) -> 0.25.
    assert g1["added_p50_ms"] == pytest.approx(0.25)
    assert g1["rps_ratio_vs_direct"] == pytest.approx(0.2)
    assert g1["cpu_us_per_request"] == pytest.approx(1.0 / 4000 * 1e6, rel=1e-3)
    assert by[(DIRECT, 1, False)]["added_p50_ms"] == 0.0
    assert g1["runq_wait_util"] == pytest.approx(0.25)  # 0.5 s over a 2-s round
    assert by[("gateway", 64, True)]["chunks_per_s"] == pytest.approx(1900 * 65, rel=1e-3)
    assert by[("gateway", 64, False)]["chunks_per_s"] is None
    assert [r["target"] for r in rows if not r["stream"] and r["concurrency"] == 64] == [
        DIRECT,
        "gateway",
        "vllm-router:round_robin",
    ]
    verdicts = {t["name"]: (t["value"], t["passed"]) for t in evaluate_targets(rows, "gateway")}
    assert verdicts["CPU us/request, c=64"] == (200.0, True)
    assert verdicts["req/s, c=64"] == (4000.0, True)
    assert verdicts["added p50 ms, c=1"] == (pytest.approx(0.25), True)
    # 30 ms against 3 x 8 ms: a miss.
    assert verdicts["p99 ms, c=64, <= 3x the faster Rust router's"] == (30.0, False)
    assert verdicts["relayed chunks/s, streamed"] == (pytest.approx(123500.0), True)
    none = {t["name"]: t["passed"] for t in evaluate_targets(rows[:2], "gateway")}
    assert none["req/s, c=64"] is None and none["added p50 ms, c=1"] is not None


def test_the_gateway_config_is_the_default_plus_one_replica(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(gateway_toml(8123, "http://127.0.0.1:9"))
    cfg = load_config(str(path))
    assert cfg.server.port == 8123
    assert [r.url for r in cfg.replicas] == ["http://127.0.0.1:9"]
    assert not cfg.grpc.enabled  # the default config, as a user's load test meets it


def test_gateway_builds_are_source_trees() -> None:
    assert parse_gateway(f"mine={REPO}") == ("mine", REPO, 1)
    assert parse_gateway(f"two={REPO}@2") == ("two", REPO, 2)
    for bad in ("nodir", f"={REPO}", "x=/nonexistent"):
        with pytest.raises(ValueError, match="NAME=DIR"):
            parse_gateway(bad)
    for bad in (f"x={REPO}@0", f"x={REPO}@two"):
        with pytest.raises(ValueError, match="N >= 1 workers"):
            parse_gateway(bad)


def test_a_short_real_run_through_the_gateway(tmp_path: Path) -> None:
    program("wrk")
    program("nginx")
    parser = argparse.ArgumentParser()
    overhead.add_arguments(parser)
    out = tmp_path / "wrk"
    args = parser.parse_args(
        ["--harness", "wrk", "--rounds", "1", "--duration", "1", "--warmup", "0",
         "--concurrency", "2", "--stream-chunks", "4", "--no-peers", "--out", str(out)]
    )  # fmt: skip
    assert overhead.run(args) == 0
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert [(r["target"], r["stream"]) for r in rows] == [
        (DIRECT, False),
        ("gateway", False),
        (DIRECT, True),
        ("gateway", True),
    ]
    for row in rows:
        assert row["errors"] == 0 and row["requests"] > 0
    gateway = [r for r in rows if r["target"] == "gateway"]
    assert all(r["cpu_us_per_request"] > 0 for r in gateway)
    streamed = next(r for r in gateway if r["stream"])
    assert streamed["chunks_per_s"] == pytest.approx(streamed["rps"] * 5, rel=0.01)
    assert results["parameters"]["gateways"] == [["gateway", str(REPO), 1]]
    assert {p["status"] for p in results["peers"]} == {"not run: --no-peers"}
    assert len(results["rounds"]) == 4
    report = (out / "report.md").read_text()
    assert "wrk -> target -> nginx" in report and "## Targets (issue 17)" in report
