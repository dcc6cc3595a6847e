"""The decision record: one DEBUG line per routing decision, decision metrics, attempt spans."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import replace

import orjson
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.config import (
    GatewayConfig,
    RoutingConfig,
)
from gateway.proxy import pipeline as pipeline_module
from gateway.proxy.requests import ParsedRequest, parse_request
from gateway.proxy.upstream import Exchange
from routing import PluginSpec
from routing.profile import BUILTIN_PROFILES
from routing.router import Router
from telemetry.metrics import GatewayMetrics
from telemetry.tracing import Tracing, TracingSettings
from tests.gateway.conftest import MODEL as SIM_MODEL
from tests.gateway.conftest import InProcessGateway, eventually, one_in_flight
from tests.gateway.fake_upstream import (
    Answer,
    FakeUpstream,
    PipelineRig,
    pipeline_rig,
    replica_configs,
)

MODEL = "m"
PROMPT = "word " * 80
LOGGER = "llm_gateway.decision"
_DEFAULT = BUILTIN_PROFILES["default"]
# The default profile with a seeded tie-break: which of two idle replicas wins is fixed.
SEEDED = RoutingConfig(
    profile="seeded",
    profiles={
        "seeded": replace(
            _DEFAULT,
            picker=replace(_DEFAULT.picker, params={**_DEFAULT.picker.params, "seed": 0}),
            name="seeded",
        )
    },
)
ROUND_ROBIN = RoutingConfig(profile="round_robin")
# One request at a time per replica: a second concurrent request waits in the admission queue.
ONE_AT_A_TIME = one_in_flight(
    PluginSpec("max_score", params={"seed": 0}), (PluginSpec("least_inflight", 2.0),), "one"
)


def rig(
    upstream: FakeUpstream,
    routing: RoutingConfig,
    replicas: int = 2,
    admission: bool = False,
    tracing: Tracing | None = None,
) -> PipelineRig:
    cfg = GatewayConfig(routing=routing, replicas=replica_configs(replicas, MODEL))
    return pipeline_rig(upstream, cfg, admission, tracing)


def chat(content: str = PROMPT, rid: str = "rid-1", user: str | None = None) -> ParsedRequest:
    body: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    if user is not None:
        body["user"] = user
    return parse_request("chat", orjson.dumps(body), rid)


async def serve(r: PipelineRig, req: ParsedRequest) -> Exchange:
    exchange = await r.pipeline.open(req, [], time.perf_counter())
    async for _ in exchange.chunks():
        pass
    r.pipeline.finish(req, exchange, exchange.status, exchange.status < 500)
    return exchange


_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')


def parse(line: str) -> dict[str, str]:
    """A logfmt line as a dict; quoted values are JSON strings."""
    fields = {k: str(orjson.loads(v)) if v.startswith('"') else v for k, v in _PAIR.findall(line)}
    # Every byte of the line belongs to some key=value pair.
    assert " ".join(f"{k}={v}" for k, v in _PAIR.findall(line)) == line
    return fields


def pairs(value: str) -> dict[str, float]:
    """A `name:number,...` list as a dict ("-": empty)."""
    if value == "-":
        return {}
    return {k: float(v) for k, v in (p.split(":") for p in value.split(","))}


def decisions(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    """The decision lines logged so far, parsed, in order."""
    return [parse(rec.getMessage()) for rec in caplog.records if rec.name == LOGGER]


# --- the log line -----------------------------------------------------------------------------


async def test_a_prefix_hit_names_the_holder_its_match_and_every_total(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    r = rig(FakeUpstream(), SEEDED)
    first = await serve(r, chat(rid="a"))
    holder = first.lease.replica.name
    second = await serve(r, chat(PROMPT + "and then some more words", rid="b"))
    assert second.lease.replica.name == holder
    miss, hit = decisions(caplog)
    assert miss["request_id"] == "a" and miss["branch"] == "miss_by_load"
    assert miss["prefix_match"] == "-" and miss["prefix_holders"] == "0"
    assert hit["request_id"] == "b" and hit["model"] == MODEL and hit["attempt"] == "1"
    assert hit["replica"] == holder and hit["branch"] == hit["router_branch"] == "prefix_hit"
    assert hit["tried"] == "-" and hit["candidates"] == "2"
    assert hit["prompt_cache"] == hit["session"] == hit["prefix_home"] == "-"
    assert hit["affinity"] == hit["affinity_kind"] == "-"
    match = pairs(hit["prefix_match"])
    assert list(match) == [holder] and match[holder] > 0 and hit["prefix_holders"] == "1"
    assert int(hit["blocks"]) > match[holder]
    totals = pairs(hit["totals"])
    assert set(totals) == {"r0", "r1"} and totals[holder] == float(hit["total"])
    # The chosen replica's score from every scorer of the profile, prefix_affinity included.
    assert set(pairs(hit["scores"])) == {s.type for s in _DEFAULT.scorers}


async def test_a_session_hit_names_the_session_tier(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    r = rig(FakeUpstream(), SEEDED)
    first = await serve(r, chat("tell me about otters", rid="a", user="alice"))
    home = first.lease.replica.name
    second = await serve(r, chat("now something else entirely", rid="b", user="alice"))
    assert second.lease.replica.name == home
    _, hit = decisions(caplog)
    assert hit["branch"] == "session" and hit["replica"] == home
    assert hit["session"] == hit["affinity"] == home and hit["affinity_kind"] == "session"
    assert hit["prompt_cache"] == "-"


async def test_a_repeated_prompt_names_the_prompt_cache_tier(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    r = rig(FakeUpstream(), SEEDED)
    home = (await serve(r, chat(rid="a"))).lease.replica.name
    await serve(r, chat(rid="b"))
    _, hit = decisions(caplog)
    assert hit["branch"] == "prompt_cache_hit" and hit["affinity_kind"] == "prompt_cache"
    assert hit["prompt_cache"] == hit["affinity"] == hit["replica"] == home


async def test_a_retry_is_attempt_2_and_never_the_failed_replica(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    r = rig(FakeUpstream(sequence=[Answer(status=503), Answer()]), SEEDED, replicas=3)
    exchange = await serve(r, chat())
    failed, served = r.upstream.calls
    first, second = decisions(caplog)
    assert (first["attempt"], first["replica"], first["tried"]) == ("1", failed, "-")
    assert first["candidates"] == "3" and len(pairs(first["totals"])) == 3
    assert second["request_id"] == first["request_id"] == "rid-1"
    assert second["attempt"] == "2" and second["replica"] == served == exchange.lease.replica.name
    assert second["tried"] == failed and second["candidates"] == "2"
    assert failed not in pairs(second["totals"])


async def test_a_queued_request_is_logged_when_it_is_routed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    r = rig(FakeUpstream(), ONE_AT_A_TIME, replicas=1, admission=True)
    assert r.admission is not None
    held_req = chat(rid="held")
    held = await r.pipeline.open(held_req, [], time.perf_counter())
    waiting = asyncio.create_task(serve(r, chat("a different prompt", rid="queued")))
    await eventually(lambda: len(r.admission.queue) == 1, what="the request to queue")  # type: ignore[union-attr]
    # Nothing is decided for a request while it waits.
    assert [d["request_id"] for d in decisions(caplog)] == ["held"]
    async for _ in held.chunks():
        pass
    r.pipeline.finish(held_req, held, held.status, True)
    exchange = await waiting
    assert exchange.decision.branch == "queued"
    _, woken = decisions(caplog)
    assert woken["request_id"] == "queued" and woken["attempt"] == "1" and woken["replica"] == "r0"
    assert woken["branch"] == "queued" and woken["router_branch"] == "max_score"
    assert woken["total"] == "2.0000" and pairs(woken["totals"]) == {"r0": 2.0}
    assert r.sample("llm_gateway_routing_decisions_total", replica="r0", branch="queued") == 1.0


async def test_odd_request_ids_are_quoted_not_split(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    r = rig(FakeUpstream(), ROUND_ROBIN)
    await serve(r, chat(rid='a b="c"'))
    (line,) = decisions(caplog)
    assert line["request_id"] == 'a b="c"' and line["branch"] == "round_robin"
    # No scorer in the profile: no totals to list, the pick's own total is 0.
    assert line["totals"] == line["scores"] == "-" and line["total"] == "0.0000"


async def test_nothing_is_formatted_when_debug_is_off(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_: object) -> str:
        raise AssertionError("a decision line was formatted")

    monkeypatch.setattr(pipeline_module, "decision_line", boom)
    monkeypatch.setattr(Router, "totals", boom)
    monkeypatch.setattr(Router, "affinity", boom)
    caplog.set_level(logging.INFO, logger=LOGGER)
    r = rig(FakeUpstream(sequence=[Answer(status=503), Answer()]), SEEDED)
    exchange = await serve(r, chat())
    assert exchange.status == 200 and len(r.upstream.calls) == 2
    assert not [rec for rec in caplog.records if rec.name == LOGGER]
    # The patch is where the pipeline formats: with DEBUG on the same request fails.
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with pytest.raises(AssertionError, match="formatted"):
        await serve(r, chat())


# --- metrics ----------------------------------------------------------------------------------


async def test_decisions_are_counted_per_replica_and_branch_retries_included() -> None:
    r = rig(FakeUpstream(by_replica={"r0": [Answer(), Answer(status=503), Answer()]}), ROUND_ROBIN)
    for i in range(3):
        await serve(r, chat(rid=f"q{i}"))
    # Round-robin: r0, r1, then r0 fails once and r1 serves the retry.
    assert r.upstream.calls == ["r0", "r1", "r0", "r1"]
    decided = "llm_gateway_routing_decisions_total"
    assert r.sample(decided, replica="r0", branch="round_robin") == 2.0
    assert r.sample(decided, replica="r1", branch="round_robin") == 2.0
    # Answered requests count each request once, on the replica that served it.
    answered = "llm_gateway_requests_total"
    labels = {"model": MODEL, "status": "200", "branch": "round_robin"}
    assert r.sample(answered, replica="r0", **labels) == 1.0
    assert r.sample(answered, replica="r1", **labels) == 2.0
    assert r.sample("llm_gateway_routing_decision_share", replica="r0") == 0.5
    assert r.sample("llm_gateway_routing_decision_window") == 4.0


def test_the_share_covers_only_the_last_window_of_decisions() -> None:
    metrics = GatewayMetrics(list, decision_window=4)

    def share(replica: str) -> float | None:
        return metrics.registry.get_sample_value(
            "llm_gateway_routing_decision_share", {"replica": replica}
        )

    assert metrics.registry.get_sample_value("llm_gateway_routing_decision_window") == 0.0
    for replica in ["a", "a", "a", "b"]:
        metrics.decision(replica, "miss_by_load")
    assert (share("a"), share("b")) == (0.75, 0.25)
    for replica in ["b", "b", "c"]:
        metrics.decision(replica, "prefix_hit")
    # The three oldest "a" decisions left the window: "a" is gone, not shown at 0.
    assert (share("a"), share("b"), share("c")) == (None, 0.75, 0.25)
    assert metrics.registry.get_sample_value("llm_gateway_routing_decision_window") == 4.0
    with pytest.raises(ValueError, match="window"):
        GatewayMetrics(list, decision_window=0)


# --- traces -----------------------------------------------------------------------------------


async def test_each_attempt_span_has_its_number_branch_and_total() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingSettings(endpoint="http://unused", sample_ratio=1.0), exporter)
    try:
        upstream = FakeUpstream(sequence=[Answer(status=503), Answer()])
        r = rig(upstream, SEEDED, replicas=3, tracing=tracing)
        exchange = await serve(r, chat())
        assert await asyncio.to_thread(tracing.flush)
    finally:
        tracing.shutdown()
    attempts = [s for s in exporter.get_finished_spans() if s.name == "upstream_attempt"]
    got = sorted(
        (dict(s.attributes or {}) for s in attempts), key=lambda a: str(a["llm_gateway.attempt"])
    )
    assert [a["llm_gateway.attempt"] for a in got] == [1, 2]
    assert [a["llm_gateway.replica"] for a in got] == r.upstream.calls
    assert [a["llm_gateway.outcome"] for a in got] == ["status_503", "ok"]
    assert all(a["llm_gateway.branch"] == "miss_by_load" for a in got)
    assert got[1]["llm_gateway.total"] == exchange.decision.total > 0.0


# --- over the ASGI app ------------------------------------------------------------------------


async def test_metrics_endpoint_exposes_the_decision_metrics(
    asgi_gateway: InProcessGateway,
) -> None:
    c = asgi_gateway.client
    await eventually(
        lambda: all(r.healthy for r in asgi_gateway.runtime.pool), what="healthy replicas"
    )
    for i in range(3):
        r = await c.post(
            "/v1/chat/completions",
            json={
                "model": SIM_MODEL,
                "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": 2,
            },
        )
        assert r.status_code == 200
    text = (await c.get("/metrics")).text
    counted = re.findall(r"^llm_gateway_routing_decisions_total\{(.*)\} (\S+)$", text, re.M)
    assert sum(float(v) for _, v in counted) == 3.0
    # Replica and branch, nothing else: no request id or prompt hash ever becomes a label.
    names = [dict(re.findall(r'(\w+)="([^"]*)"', labels)) for labels, _ in counted]
    assert all(set(n) == {"replica", "branch"} for n in names)
    assert {n["replica"] for n in names} <= {r.name for r in asgi_gateway.runtime.pool}
    shares = re.findall(
        r'^llm_gateway_routing_decision_share\{replica="[^"]+"\} (\S+)$', text, re.M
    )
    assert shares and sum(float(v) for v in shares) == pytest.approx(1.0)
    assert "llm_gateway_routing_decision_window 3.0" in text
