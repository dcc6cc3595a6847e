"""The fault suite: its accounting (a dropped request is caught), its client, a small run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from benchmarks.faults.accounting import (
    CANCELLED,
    COMPLETE,
    ERROR,
    LOST,
    Record,
    StreamVerdict,
    http_outcome,
    summarize,
)
from benchmarks.faults.clients import LoadRun, LoadSettings, one_request
from benchmarks.faults.procs import by_label, metric_sums
from benchmarks.faults.report import write_outputs
from benchmarks.faults.suite import Params, checks, measure
from tests.gateway.aiohttp_upstream import serve
from vllm_api.errors import error_body
from vllm_api.sse import DONE_EVENT, error_event


def _rec(index: int, kind: str, detail: str, status: int = 200) -> Record:
    return Record(index, kind, detail, status, started=float(index), ended=float(index) + 1.5)


def test_a_lost_request_is_counted_and_the_sums_still_match() -> None:
    records = [
        _rec(0, COMPLETE, "stream"),
        _rec(1, ERROR, "http_503", 503),
        _rec(2, CANCELLED, "after_3_events"),
        _rec(3, LOST, "truncated"),
        _rec(4, ERROR, "sse_502"),
    ]
    s = summarize(records, sent=5)
    assert (s.completed, s.errors, s.cancelled, s.lost) == (1, 2, 1, 1)
    assert s.lost_by_kind == {"truncated": 1}
    assert s.errors_by_kind == {"http_503": 1, "sse_502": 1}
    assert s.counts_match and s.longest_s == 1.5


def test_a_request_sent_but_never_recorded_is_lost() -> None:
    s = summarize([_rec(0, COMPLETE, "stream"), _rec(2, COMPLETE, "stream")], sent=3)
    assert s.lost == 1 and s.unrecorded == 1 and s.lost_by_kind == {"no_record": 1}
    assert s.counts_match


def test_a_request_recorded_twice_or_never_sent_is_a_bug() -> None:
    with pytest.raises(ValueError, match="more than once"):
        summarize([_rec(0, COMPLETE, "stream"), _rec(0, LOST, "hang")], sent=1)
    with pytest.raises(ValueError, match="never sent"):
        summarize([_rec(5, COMPLETE, "stream")], sent=1)


def _results(lost: int, in_flight: int) -> dict[str, Any]:
    summary = summarize([_rec(0, COMPLETE, "stream")] + [_rec(1, LOST, "hang")] * lost, 1 + lost)
    return {
        "summary": {
            **summary.to_json(),
            "in_flight_at_end": in_flight,
            "queued_at_end": 0,
            "gateway_alive_at_end": True,
            "gateway_answered": 1 + lost,
            "rss_mib": {"before": 80.0, "peak": 120.0, "after": 110.0},
        },
        "slowloris": {"longest_open_s": 10.5, "connections_opened": 3},
        "timeline": [{"at_s": 1.0}, {"at_s": 2.0}],
        "faults": [{"name": "x"}],
    }


@pytest.mark.parametrize(
    ("lost", "in_flight", "failed"),
    [(0, 0, set()), (1, 0, {"nothing lost"}), (0, 2, {"in flight back to 0"})],
)
def test_the_checks_fail_on_a_lost_request_or_in_flight_left(
    lost: int, in_flight: int, failed: set[str]
) -> None:
    rows = checks(_results(lost, in_flight), Params(out=Path("unused")))
    assert {r["check"] for r in rows if not r["passed"]} == failed


def _verdict(*events: bytes) -> tuple[str, str]:
    v = StreamVerdict()
    for line in b"".join(events).split(b"\n"):
        v.feed(line)
    return v.outcome()


CHUNK = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'


def test_stream_verdicts() -> None:
    assert _verdict(CHUNK, DONE_EVENT) == (COMPLETE, "stream")
    assert _verdict(CHUNK, error_event("broke", 502)) == (ERROR, "sse_502")
    assert _verdict(CHUNK) == (LOST, "truncated")
    assert _verdict(CHUNK, b'data: {"error": "boom"}\n\n') == (LOST, "unclear_sse_error")
    assert _verdict(CHUNK, b"data: {not json\n\n") == (LOST, "unclear_sse_event")
    assert _verdict(CHUNK, DONE_EVENT, CHUNK) == (LOST, "events_after_end")
    assert _verdict(error_event("a", 500), DONE_EVENT) == (LOST, "events_after_end")


def test_http_outcomes() -> None:
    assert http_outcome(503, error_body("no replica", 503)) == (ERROR, "http_503")
    assert http_outcome(500, b"Internal Server Error") == (LOST, "unclear_http_500")
    assert http_outcome(502, orjson.dumps({"detail": "Bad"})) == (LOST, "unclear_http_502")
    assert http_outcome(200, orjson.dumps({"choices": [{"text": "x"}]})) == (COMPLETE, "unary")
    assert http_outcome(200, orjson.dumps({"choices": []})) == (LOST, "unclear_http_200")


def test_metric_sums_by_label() -> None:
    text = (
        "# HELP x y\n"
        'llm_gateway_upstream_retries_total{reason="timeout",replica="r0"} 2.0\n'
        'llm_gateway_upstream_retries_total{reason="timeout",replica="r1"} 1.0\n'
        'llm_gateway_upstream_retries_total{replica="r1",reason="status_500"} 4.0\n'
        'llm_gateway_in_flight_requests{replica="r0"} 0.0\n'
    )
    sums = metric_sums(text)
    assert sums["llm_gateway_upstream_retries_total"] == 7.0
    assert by_label(sums, "llm_gateway_upstream_retries_total", "reason") == {
        "timeout": 3.0,
        "status_500": 4.0,
    }


async def _misbehaving(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(CHUNK)
    how = request.match_info["how"]
    if how == "hang":
        await asyncio.sleep(1.5)  # the fault itself: silent far past the client's deadline
    elif how == "reset":
        assert request.transport is not None
        request.transport.abort()
        return resp
    elif how == "done":
        await resp.write(CHUNK + DONE_EVENT)
    await resp.write_eof()
    return resp


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/{how}", _misbehaving)
    async with serve(app) as url:
        yield url


@pytest.mark.parametrize(
    ("how", "leave", "expected"),
    [
        ("done", None, (COMPLETE, "stream")),
        ("hang", None, (LOST, "hang")),
        ("truncate", None, (LOST, "truncated")),
        ("reset", None, (LOST, "transport:ClientPayloadError")),
        ("hang", 1, (CANCELLED, "after_1_events")),
    ],
)
async def test_the_client_tells_every_ending_apart_over_a_socket(
    upstream: str, how: str, leave: int | None, expected: tuple[str, str]
) -> None:
    run = LoadRun(t0=time.monotonic())
    async with aiohttp.ClientSession() as session:
        rec = await one_request(
            session, f"{upstream}/{how}", {"stream": True}, 0, run, deadline_s=0.5,
            leave_after=leave,
        )  # fmt: skip
    assert (rec.kind, rec.detail) == expected


async def test_a_small_run_loses_nothing_and_ends_with_nothing_in_flight(tmp_path: Path) -> None:
    p = Params(
        out=tmp_path,
        replicas=4,
        load=LoadSettings(concurrency=40, duration_s=20.0, deadline_s=30.0),
        slowloris_connections=32,
        header_timeout_s=2.0,
    )
    results = await measure(p)
    s = results["summary"]
    assert s["lost"] == 0, s["lost_by_kind"]
    assert s["counts_match"] and s["sent"] == s["completed"] + s["errors"] + s["cancelled"]
    assert s["in_flight_at_end"] == 0 and s["queued_at_end"] == 0
    # The faults bit: errors reached clients in a clear shape, retries happened, clients left.
    assert s["completed"] > 0 and s["errors"] > 0 and s["retried"] > 0 and s["cancelled"] > 0
    assert all("error" not in e for e in results["timeline"]), results["timeline"]
    # The slowloris connections were cut by the head deadline (408), none held open.
    assert results["slowloris"]["answered_by_status"].get("408", 0) > 0
    failed = [c for c in results["checks"] if not c["passed"]]
    assert failed == []
    write_outputs({"meta": _META, **results}, tmp_path)
    assert "| **lost** | **0**" in (tmp_path / "report.md").read_text()


_META = {
    "date": "2026-12-02",
    "command": "llm-gateway bench faults",
    "machine": {"cpu_model": "test", "cpus_usable": 2, "loadavg_at_start": [0.0, 0.0, 0.0]},
}
