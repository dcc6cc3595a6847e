"""/v1/realtime on the request pipeline's stages, over sockets: model versions, tenant quotas,
the admission queue, the trace and the request log (simulated vLLM realtime replicas)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import pytest
import websockets
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from websockets.asyncio.client import ClientConnection, connect

from gateway.config import (
    AdmissionConfig,
    GatewayConfig,
    HealthCheckConfig,
    ReplicaConfig,
    ScoreLoopConfig,
    ServerConfig,
    TelemetryConfig,
    UpstreamConfig,
)
from gateway.process import running_gateway
from gateway.proxy.quota import LocalQuotaStore
from gateway.proxy.tenancy_config import TenancyConfig, TenantConfig
from gateway.versions_config import ModelVersionsConfig, TrafficConfig
from routing.versions import Version
from simulator import SimFleet
from simulator.realtime import open_sessions
from tests import otlp_collector
from tests.gateway.conftest import ONE_EACH, eventually
from tests.gateway.http.test_realtime import (
    AUTH,
    KEY,
    RT,
    RT_MODEL,
    GatewayView,
    close_code,
    recv,
    refused,
    transcribe,
)

collector = otlp_collector.collector  # the fixture, under its own name

CANARY_MODEL = "sim-voxtral-v2"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


@dataclass
class Rig(GatewayView):
    fleets: list[SimFleet]

    def queued(self) -> int:
        assert self.gw.runtime.admission is not None
        return len(self.gw.runtime.admission.queue)


@asynccontextmanager
async def rig(
    models: tuple[str, ...] = (RT_MODEL,),
    labels: tuple[dict[str, str], ...] = (),
    **overrides: Any,
) -> AsyncIterator[Rig]:
    """One simulated realtime replica per model in `models` (rt-0, rt-1, ...; `labels` each)
    behind a gateway."""
    async with AsyncExitStack() as stack:
        fleets = [
            await stack.enter_async_context(
                SimFleet(replace(RT, model=m), replicas=1, host="127.0.0.1", base_port=0)
            )
            for m in models
        ]
        cfg = GatewayConfig(
            server=ServerConfig(port=0, api_keys=(KEY,)),
            upstream=UpstreamConfig(connect_timeout_s=1.0),
            health_check=HealthCheckConfig(interval_s=0.1, timeout_s=0.5),
            replicas=tuple(
                ReplicaConfig(
                    url=f.replicas[0].url,
                    name=f"rt-{i}",
                    labels=labels[i] if labels else {},
                )
                for i, f in enumerate(fleets)
            ),
        )
        gw = await stack.enter_async_context(running_gateway(replace(cfg, **overrides)))
        yield Rig(gw, fleets)


# --- the traffic stage ------------------------------------------------------------------------

VOICE = ModelVersionsConfig(
    RT_MODEL, (Version("v1", 100, "stable"), Version("v2", 0, "initial", served_model=CANARY_MODEL))
)


async def test_a_sessions_model_goes_through_its_versions() -> None:
    traffic = TrafficConfig(model_versions=(VOICE,), allow_canary_header=True)
    async with rig((RT_MODEL, CANARY_MODEL), traffic=traffic) as r:
        canary = {**AUTH, "x-canary-weight": "100"}
        # Named in the URL: the replica serves the canary under its own name, which the
        # gateway puts in the session.update (vLLM refuses any other name).
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=canary) as ws:
            assert (await recv(ws))["type"] == "session.created"
            await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
            deltas, done = await transcribe(ws)
            assert done["type"] == "transcription.done" and len(deltas) == 6
            assert r.in_flight() == {"rt-0": 0, "rt-1": 1}
        # Named in-band: the same version stage before the replica is chosen.
        async with connect(r.url, additional_headers=canary) as ws:
            await recv(ws)
            await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
            deltas, _ = await transcribe(ws)
            assert len(deltas) == 6
            assert r.in_flight() == {"rt-0": 0, "rt-1": 1}
        # No override: the stable version's weight of 100 keeps it off the canary.
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as ws:
            await recv(ws)
            await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
            await transcribe(ws)
            assert r.in_flight() == {"rt-0": 1, "rt-1": 0}
        counts = r.gw.runtime.metrics.registry.get_sample_value
        labels = {"model": RT_MODEL, "version": "v2"}
        assert counts("llm_gateway_model_version_requests_total", labels) == 2
        ended = {(CANARY_MODEL, "client_closed"): 2.0, (RT_MODEL, "client_closed"): 1.0}
        await eventually(lambda: r.outcomes() == ended, what="each counted under its model")


async def test_a_versions_labels_keep_a_session_on_its_replicas() -> None:
    versions = ModelVersionsConfig(
        RT_MODEL,
        (
            Version("v1", 100, "stable", labels={"version": "v1"}),
            Version("v2", 0, "initial", labels={"version": "v2"}),
        ),
    )
    traffic = TrafficConfig(model_versions=(versions,), allow_canary_header=True)
    labels = ({"version": "v1"}, {"version": "v2"})
    async with rig((RT_MODEL, RT_MODEL), labels, traffic=traffic) as r:
        # Two sessions at once on one version: load alone would spread them over both.
        for weight, busy in (("100", {"rt-0": 0, "rt-1": 2}), ("0", {"rt-0": 2, "rt-1": 0})):
            headers = {**AUTH, "x-canary-weight": weight}
            async with (
                connect(r.url, additional_headers=headers) as one,
                connect(r.url + f"?model={RT_MODEL}", additional_headers=headers) as two,
            ):
                for ws in (one, two):
                    await recv(ws)
                    await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
                    deltas, _ = await transcribe(ws)
                    assert len(deltas) == 6
                assert r.in_flight() == busy
            await eventually(lambda: r.in_flight() == {"rt-0": 0, "rt-1": 0}, what="released")


# --- tenant quotas ----------------------------------------------------------------------------

ACME = "acme-key"


def _tenancy(**limits: int) -> TenancyConfig:
    return TenancyConfig(
        tenants={"acme": TenantConfig(keys=(ACME,), **limits)}, default_completion_tokens=5
    )


ACME_AUTH = {"Authorization": f"Bearer {ACME}"}


async def test_a_session_holds_its_tenants_concurrency_slot_for_its_life() -> None:
    async with rig(tenancy=_tenancy(max_concurrent=1)) as r:
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=ACME_AUTH) as ws:
            await recv(ws)
            for url in (r.url, r.url + f"?model={RT_MODEL}"):
                with pytest.raises(websockets.InvalidStatus) as caught:
                    async with connect(url, additional_headers=ACME_AUTH):
                        pass
                response = caught.value.response
                assert response.status_code == 429
                assert response.headers["retry-after"] == "1"
                body = json.loads(bytes(response.body or b""))
                assert body["error"]["code"] == 429
                assert "max_concurrent" in body["error"]["message"]
            # Another tenant (the server's key: "default") is not limited by acme's quota.
            async with connect(r.url, additional_headers=AUTH) as other:
                assert (await recv(other))["type"] == "session.created"
        store = r.gw.runtime.tenancy.store
        assert isinstance(store, LocalQuotaStore)
        await eventually(lambda: store.in_flight("acme") == 0, what="the slot freed")
        async with connect(r.url, additional_headers=ACME_AUTH) as ws:
            assert (await recv(ws))["type"] == "session.created"
        assert r.outcomes()[("_unknown", "rate_limited")] == 1
        assert r.outcomes()[(RT_MODEL, "rate_limited")] == 1


async def test_a_session_is_one_request_per_minute_and_settles_its_usage() -> None:
    async with rig(tenancy=_tenancy(requests_per_minute=1, tokens_per_minute=600)) as r:
        store = r.gw.runtime.tenancy.store
        assert isinstance(store, LocalQuotaStore)
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=ACME_AUTH) as ws:
            await recv(ws)
            await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
            usage = 0
            for _ in range(2):
                _, done = await transcribe(ws)
                usage += done["usage"]["total_tokens"]
            # While open, the reservation (default_completion_tokens) is what it holds.
            limits = r.gw.runtime.tenancy.tenant("acme").limits
            assert store.counters("acme", limits, 0.0).tokens.level <= 600 - 5 + 1
        await eventually(lambda: store.in_flight("acme") == 0, what="settled")
        # Settled with the two utterances' usage instead (a minute's budget refills at 10/s).
        level = store.counters("acme", limits, 0.0).tokens.level
        assert usage == 24  # two utterances of 6 prompt and 6 completion tokens
        assert 600 - usage - 1 <= level <= 600 - usage + 10, (level, usage)
        status, body = await refused(r.url, additional_headers=ACME_AUTH)
        assert status == 429 and "requests_per_minute" in body["error"]["message"]


# --- the admission queue ----------------------------------------------------------------------


def queueing(**admission: Any) -> dict[str, Any]:
    return {
        "routing": ONE_EACH,
        "admission": AdmissionConfig(**admission),
        "score_loop": ScoreLoopConfig(scrape_interval_s=30.0),
    }


async def connect_with_key(url: str) -> ClientConnection:
    return await connect(url, additional_headers=AUTH)


async def test_a_session_waits_in_the_admission_queue_while_its_replica_is_full() -> None:
    async with rig(**queueing()) as r:
        first = await connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH)
        await recv(first)
        # Named in the URL: it waits before its upgrade is answered, as an HTTP request would.
        waiting = asyncio.create_task(connect_with_key(r.url + f"?model={RT_MODEL}"))
        await eventually(lambda: r.queued() == 1, what="queued")
        # Named in-band: it waits after session.created, its frames held.
        inband = await connect(r.url, additional_headers=AUTH)
        await recv(inband)
        await inband.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
        await eventually(lambda: r.queued() == 2, what="both queued")
        assert not waiting.done()
        await first.close()
        second = await waiting  # the first one's lease freed: the head of the queue goes
        assert (await recv(second))["type"] == "session.created"
        assert r.queued() == 1
        await second.close()
        deltas, _ = await transcribe(inband)
        assert len(deltas) == 6
        await inband.close()
        await eventually(lambda: r.in_flight() == {"rt-0": 0}, what="leases released")
        assert 'branch="queued",replica="rt-0"} 2.0' in r.gw.runtime.metrics.render().decode()


async def test_a_session_that_waits_too_long_is_refused_with_429() -> None:
    async with rig(**queueing(max_wait_s=0.2)) as r:
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as ws:
            await recv(ws)
            with pytest.raises(websockets.InvalidStatus) as caught:
                async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH):
                    pass
            response = caught.value.response
            assert response.status_code == 429 and int(response.headers["retry-after"]) >= 1
            assert json.loads(bytes(response.body or b""))["error"]["code"] == 429
            async with connect(r.url, additional_headers=AUTH) as inband:
                await recv(inband)
                await inband.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
                assert await close_code(inband) == 1013  # "try again later"
        assert r.outcomes()[(RT_MODEL, "rate_limited")] == 2
        await eventually(lambda: r.in_flight() == {"rt-0": 0}, what="lease released")


# --- the trace and the request log ------------------------------------------------------------


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = v.string_value or v.int_value or v.double_value or v.bool_value
    return out


async def test_a_session_is_traced_and_logged(
    collector: tuple[str, list[ExportTraceServiceRequest]], caplog: pytest.LogCaptureFixture
) -> None:
    endpoint, received = collector
    caplog.set_level(logging.INFO, logger="llm_gateway.request")
    telemetry = TelemetryConfig(tracing_endpoint=endpoint, request_log=True)
    async with rig(telemetry=telemetry) as r:
        headers = {**AUTH, "traceparent": PARENT, "x-request-id": "rt-1"}
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=headers) as ws:
            await recv(ws)
            await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
            _, done = await transcribe(ws)
        await eventually(lambda: open_sessions(r.fleets[0].replicas[0]) == 0, what="closed")
        tracing = r.gw.runtime.tracing
        assert tracing is not None
        await eventually(
            lambda: any(x.name == "llm_gateway.request" for x in caplog.records), what="record"
        )
        assert await asyncio.to_thread(tracing.flush)
    spans = [
        s for m in received for rs in m.resource_spans for ss in rs.scope_spans for s in ss.spans
    ]
    [server] = [s for s in spans if s.name == "GET /v1/realtime"]
    [attempt] = [s for s in spans if s.name == "upstream_attempt"]
    assert server.trace_id.hex() == attempt.trace_id.hex() == TRACE_ID
    assert attempt.parent_span_id == server.span_id
    attrs = _attrs(server)
    assert attrs["llm_gateway.model"] == RT_MODEL and attrs["llm_gateway.replica"] == "rt-0"
    assert attrs["llm_gateway.outcome"] == "client_closed"
    assert attrs["http.response.status_code"] == 101
    # In: session.update and the three audio events; out: session.created, 6 deltas, done.
    assert (attrs["llm_gateway.frames_in"], attrs["llm_gateway.frames_out"]) == (4, 8)
    assert attrs["llm_gateway.duration_s"] > 0
    assert _attrs(attempt)["llm_gateway.outcome"] == "ok"
    [record] = [x for x in caplog.records if x.name == "llm_gateway.request"]
    fields: dict[str, Any] = record.__dict__
    assert fields["request_id"] == "rt-1" and fields["model"] == RT_MODEL
    assert (fields["replica"], fields["status"], fields["tenant"]) == ("rt-0", 101, "default")
    assert (fields["outcome"], fields["close_code"]) == ("client_closed", None)
    assert (fields["frames_in"], fields["frames_out"]) == (4, 8)
    assert fields["usage_tokens"] == done["usage"]["total_tokens"]


async def test_a_queued_session_whose_client_leaves_leaves_the_queue_at_once() -> None:
    async with rig(**queueing()) as r:
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as first:
            await recv(first)
            upgrading = asyncio.create_task(connect_with_key(r.url + f"?model={RT_MODEL}"))
            await eventually(lambda: r.queued() == 1, what="queued before its upgrade")
            upgrading.cancel()  # the client gives up: its socket closes
            await eventually(lambda: r.queued() == 0, what="out of the queue")
            inband = await connect(r.url, additional_headers=AUTH)
            await recv(inband)
            await inband.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
            await eventually(lambda: r.queued() == 1, what="queued after session.created")
            inband.transport.abort()
            await eventually(lambda: r.queued() == 0, what="out of the queue")
            gone = (RT_MODEL, "client_closed")
            await eventually(lambda: r.outcomes().get(gone) == 2, what="both counted")
            # The session that held the replica is untouched.
            await first.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
            deltas, _ = await transcribe(first)
            assert len(deltas) == 6
        await eventually(lambda: r.in_flight() == {"rt-0": 0}, what="lease released")
