"""Traces over real sockets: gateway spans reach an OTLP/HTTP collector, context reaches vLLM."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gateway.config import RoutingConfig, TelemetryConfig
from gateway.process import running_gateway
from gateway.proxy.tenancy_config import TenancyConfig
from simulator import SimFleet
from tests import otlp_collector
from tests.gateway.conftest import MODEL, gateway_config, set_faults

collector = otlp_collector.collector  # the fixture, under its own name

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


def _spans(received: list[ExportTraceServiceRequest]) -> list[object]:
    return [
        s for m in received for rs in m.resource_spans for ss in rs.scope_spans for s in ss.spans
    ]


def _attrs(span: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in span.attributes:  # type: ignore[attr-defined]
        v = kv.value
        out[kv.key] = v.string_value or v.int_value or v.bool_value
    return out


async def test_request_and_retried_attempts_are_traced(
    fleet: SimFleet, collector: tuple[str, list[ExportTraceServiceRequest]]
) -> None:
    endpoint, received = collector
    cfg = gateway_config(
        fleet,
        routing=RoutingConfig(profile="round_robin"),
        telemetry=TelemetryConfig(tracing_endpoint=endpoint),
        # The test client is on loopback: trusted to name its tenant by header.
        tenancy=TenancyConfig(trusted_sources=("127.0.0.1/32",)),
    )
    cfg = replace(cfg, health_check=replace(cfg.health_check, interval_s=30.0))
    async with running_gateway(cfg) as gw, httpx.AsyncClient(base_url=gw.url) as c:
        await set_faults(fleet.replicas[0].url, reset_before_first_byte=True)
        for _ in range(2):  # round-robin: one of the two starts on the broken replica
            r = await c.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                },
                headers={"traceparent": PARENT, "x-tenant-id": "acme", "x-priority": "3"},
            )
            assert r.status_code == 200
        assert gw.runtime.tracing is not None
        assert await asyncio.to_thread(gw.runtime.tracing.flush)
    spans = _spans(received)
    servers = [s for s in spans if s.name == "POST /v1/chat/completions"]  # type: ignore[attr-defined]
    attempts = [s for s in spans if s.name == "upstream_attempt"]  # type: ignore[attr-defined]
    assert len(servers) == 2 and len(attempts) == 3
    for s in spans:  # the client's trace continues through the gateway
        assert s.trace_id.hex() == TRACE_ID  # type: ignore[attr-defined]
    server_ids = {s.span_id for s in servers}  # type: ignore[attr-defined]
    assert all(a.parent_span_id in server_ids for a in attempts)  # type: ignore[attr-defined]
    outcomes = sorted(str(_attrs(a)["llm_gateway.outcome"]) for a in attempts)
    assert outcomes[-1] == "ok" and outcomes.count("ok") == 2
    done = _attrs(servers[0])
    assert done["llm_gateway.model"] == MODEL and done["http.response.status_code"] == 200
    assert done["llm_gateway.branch"] == "round_robin"
    # The priority is the admission class: x-priority 3 is past the lowest, P2.
    assert (done["llm_gateway.tenant"], done["llm_gateway.priority"]) == ("acme", 2)
