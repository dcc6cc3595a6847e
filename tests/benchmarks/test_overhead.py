"""The overhead benchmark: its client against the static upstream, its maths, a tiny run."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from benchmarks import loadgen_grpc, overhead
from benchmarks.loadgen_http import RoundResult, chat_request, run_round
from benchmarks.overhead_procs import peer_routers
from benchmarks.overhead_report import (
    DIRECT,
    GATEWAY,
    GATEWAY_GRPC,
    Measured,
    build_rows,
    evaluate_targets,
    peers_markdown,
)
from benchmarks.routing_bench.contenders import FleetInfo
from benchmarks.static_upstream import MODEL, start
from gateway.grpc.gen import gateway_pb2 as pb
from gateway.grpc.gen import gateway_pb2_grpc as pb_grpc

ROW_FIELDS = {
    "target",
    "concurrency",
    "stream",
    "rps",
    "p50_ms",
    "p99_ms",
    "added_p50_ms",
    "added_p99_ms",
    "rps_ratio_vs_direct",
    "cpu_us_per_request",
    "gateway_cpu_util",
    "chunks_per_s",
    "http_chunks_per_s",
    "ttfc_p50_ms",
    "added_ttfc_p50_ms",
    "loadgen_cpu_us_per_request",
    "requests",
    "errors",
}


def _cpu() -> dict[str, float]:
    return {"gateway": 0.0, "upstream": 0.0, "loadgen": time.process_time()}


@pytest.mark.parametrize("stream", [False, True])
async def test_loadgen_completes_every_request_against_static_upstream(stream: bool) -> None:
    server = await start("127.0.0.1", 0, chunks=7)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await run_round(
            "127.0.0.1",
            port,
            chat_request("127.0.0.1", port, MODEL, stream),
            concurrency=3,
            duration_s=0.2,
            stream=stream,
            expect_events=8,
            cpu_snapshot=_cpu,
        )
    finally:
        server.close()
    assert result.errors == 0, result.error_kinds
    assert result.requests > 0
    assert len(result.latencies_s) == result.requests
    if stream:
        # 7 deltas + [DONE] per answer, counted only inside the window.
        assert result.events >= 8 * result.requests
        assert len(result.ttfc_s) == result.requests
    else:
        assert result.events == 0


async def test_loadgen_learns_the_event_count_and_sends_extra_headers() -> None:
    server = await start("127.0.0.1", 0, chunks=6)
    port = server.sockets[0].getsockname()[1]
    request = chat_request("127.0.0.1", port, MODEL, True, {"authorization": "Bearer k"})
    try:
        result = await run_round(
            "127.0.0.1",
            port,
            request,
            concurrency=2,
            duration_s=0.2,
            stream=True,
            expect_events=None,
            cpu_snapshot=_cpu,
        )
    finally:
        server.close()
    assert request.split(b"\r\n\r\n", 1)[0].endswith(b"\r\nauthorization: Bearer k")
    assert result.errors == 0, result.error_kinds
    assert result.requests > 0
    assert result.events_per_answer == 7  # 6 deltas + [DONE]


async def test_loadgen_flags_a_stream_with_the_wrong_event_count() -> None:
    server = await start("127.0.0.1", 0, chunks=5)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await run_round(
            "127.0.0.1",
            port,
            chat_request("127.0.0.1", port, MODEL, True),
            concurrency=2,
            duration_s=0.1,
            stream=True,
            expect_events=9,
            cpu_snapshot=_cpu,
        )
    finally:
        server.close()
    assert result.requests == 0
    assert result.error_kinds == {"bad_stream": 2}


class _Inference(pb_grpc.InferenceServicer):
    """Answers Chat, and StreamChat with a role chunk, content chunks and a finishing one."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks

    async def Chat(self, request: pb.ChatRequest, context: object) -> pb.ChatResponse:
        message = pb.ChatMessage(role="assistant", content="hi")
        return pb.ChatResponse(
            model=request.model, choices=[pb.ChatChoice(message=message, finish_reason="stop")]
        )

    async def StreamChat(self, request: pb.ChatRequest, context: object) -> AsyncIterator[object]:
        yield pb.ChatChunk(choices=[pb.ChatChunkChoice(delta=pb.ChatMessage(role="assistant"))])
        for i in range(1, self.chunks - 1):
            yield pb.ChatChunk(choices=[pb.ChatChunkChoice(delta=pb.ChatMessage(content=f"{i}"))])
        yield pb.ChatChunk(choices=[pb.ChatChunkChoice(finish_reason="stop")])


async def _grpc_server(chunks: int) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    pb_grpc.add_InferenceServicer_to_server(_Inference(chunks), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _no_cpu() -> dict[str, float]:
    return {"gateway": 0.0, "upstream": 0.0}


async def test_grpc_loadgen_completes_unary_and_streamed_calls() -> None:
    server, target = await _grpc_server(chunks=6)
    try:
        async with loadgen_grpc.grpc_loadgen(2) as clients:
            results = {
                stream: await clients.run_round(
                    target,
                    loadgen_grpc.chat_request(MODEL),
                    concurrency=3,
                    channels=2,
                    # A clean-clone CI run read 0.0 s of worker CPU over a 0.3-s round (0.19 s
                    # here): this process also serves the calls, so its CPU window can start
                    # late. A longer round leaves it more margin.
                    duration_s=1.0,
                    stream=stream,
                    expect_messages=6,
                    cpu_snapshot=_no_cpu,
                )
                for stream in (False, True)
            }
    finally:
        await server.stop(None)
    for stream, result in results.items():
        assert result.errors == 0, result.error_kinds
        assert result.requests > 0
        assert len(result.latencies_s) == result.requests
        assert result.cpu_s["loadgen"] > 0  # the workers' CPU, not this process's
        assert result.http_chunks == 0
        if stream:
            assert result.events == 6 * result.requests
            assert len(result.ttfc_s) == result.requests
        else:
            assert result.events == 0 and result.ttfc_s == []


async def test_grpc_loadgen_flags_a_stream_with_the_wrong_message_count() -> None:
    server, target = await _grpc_server(chunks=5)
    try:
        async with loadgen_grpc.grpc_loadgen(1) as clients:
            result = await clients.run_round(
                target,
                loadgen_grpc.chat_request(MODEL),
                concurrency=2,
                channels=1,
                duration_s=0.1,
                stream=True,
                expect_messages=9,
                cpu_snapshot=_no_cpu,
            )
    finally:
        await server.stop(None)
    assert result.requests == 0
    assert result.error_kinds["bad_stream"] >= 2


async def test_grpc_loadgen_reports_a_refused_call_by_its_status() -> None:
    server = grpc.aio.server()  # no services: every call is UNIMPLEMENTED
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with loadgen_grpc.grpc_loadgen(1) as clients:
            result = await clients.run_round(
                f"127.0.0.1:{port}",
                loadgen_grpc.chat_request(MODEL),
                concurrency=1,
                channels=1,
                duration_s=0.1,
                stream=False,
                expect_messages=2,
                cpu_snapshot=_no_cpu,
            )
    finally:
        await server.stop(None)
    assert result.requests == 0
    assert set(result.error_kinds) == {"grpc_unimplemented"}


def _round(target: str, index: int, requests: int, latency_ms: float) -> Measured:
    result = RoundResult(
        duration_s=1.0,
        requests=requests,
        errors=0,
        latencies_s=[latency_ms / 1e3] * requests,
        ttfc_s=[],
        events=0,
        http_chunks=0,
        cpu_s={"gateway": 0.5 if target == GATEWAY else 0.0, "upstream": 0.1, "loadgen": 0.2},
    )
    return Measured(target, 1, False, index, result)


def test_rows_pair_each_gateway_round_with_its_direct_round() -> None:
    measured = [
        _round(DIRECT, 0, 10_000, 0.1),
        _round(GATEWAY, 0, 2_000, 0.5),
        _round(DIRECT, 1, 8_000, 0.2),
        _round(GATEWAY, 1, 2_000, 0.4),
    ]
    rows = build_rows(measured)
    direct, gw = rows
    assert direct["target"] == DIRECT and direct["added_p50_ms"] == 0.0
    assert direct["rps_ratio_vs_direct"] == 1.0
    assert gw["rps"] == 2000.0
    assert gw["added_p50_ms"] == pytest.approx(0.3)  # median of 0.4 and 0.2
    assert gw["rps_ratio_vs_direct"] == pytest.approx(0.225)  # median of 0.2 and 0.25
    assert gw["cpu_us_per_request"] == 250.0
    assert gw["chunks_per_s"] is None
    targets = {t["field"]: t for t in evaluate_targets(rows)}
    assert targets["added_p50_ms"]["passed"] is True
    assert targets["rps"]["value"] is None and targets["rps"]["passed"] is None


def test_peer_rows_pair_with_the_direct_rounds_they_ran_beside() -> None:
    measured = [
        _round(DIRECT, 0, 10_000, 0.1),
        _round(GATEWAY, 0, 2_000, 0.5),
        _round("litellm:least-busy", 0, 100, 20.0),
        _round("sglang:round_robin", 0, 3_000, 0.3),
        _round(DIRECT, 1, 8_000, 0.2),
        _round(GATEWAY, 1, 2_000, 0.4),
        _round("sglang:round_robin", 1, 3_000, 0.6),
    ]
    rows = {r["target"]: r for r in build_rows(measured)}
    order = [r["target"] for r in build_rows(measured)]
    assert order == [DIRECT, GATEWAY, "litellm:least-busy", "sglang:round_robin"]
    litellm = rows["litellm:least-busy"]
    assert litellm["rounds"] == 1
    assert litellm["added_p50_ms"] == pytest.approx(19.9)  # against direct round 0 only
    assert litellm["rps_ratio_vs_direct"] == pytest.approx(0.01)
    assert rows["sglang:round_robin"]["added_p50_ms"] == pytest.approx(0.3)  # 0.2 and 0.4
    # Peers are never scored against the gateway's targets.
    assert {t["value"] for t in evaluate_targets(list(rows.values()))} == {None, 0.3}


async def test_peers_not_installed_are_listed_as_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_CACHE", str(tmp_path / "empty-cache"))
    info = FleetInfo(("http://127.0.0.1:9",), MODEL, (None,), None, 16, "static")
    async with peer_routers(overhead.DEFAULT_PEERS, info) as runs:
        assert [r.name for r in runs] == list(overhead.DEFAULT_PEERS)
        for r in runs:
            assert not r.running and r.contender is None and r.cpu_seconds() == 0.0
            assert r.status.startswith("not run: ") and "is not installed" in r.status
            assert r.version is None
    section = "\n".join(peers_markdown([r.as_json() for r in runs]))
    assert "## Peers" in section
    assert "| sglang:round_robin | - | not run: sglang-router is not installed" in section
    assert "| litellm:least-busy | - | not run: litellm is not installed" in section


def _parse(*argv: str) -> overhead.Params:
    parser = argparse.ArgumentParser()
    overhead.add_arguments(parser)
    return overhead.params_from_args(parser.parse_args(list(argv)))


def test_peer_options() -> None:
    assert _parse().peers == overhead.DEFAULT_PEERS
    assert _parse("--peers", "vllm-router:round_robin").peers == ("vllm-router:round_robin",)
    off = _parse("--no-peers")
    assert off.peers == () and off.peers_off
    with pytest.raises(ValueError, match="unknown peer"):
        _parse("--peers", "nginx:round_robin")
    with pytest.raises(ValueError, match="together"):
        _parse("--peers", "sglang:round_robin", "--no-peers")
    with pytest.raises(ValueError, match="litellm-rounds"):
        _parse("--litellm-rounds", "0")


def test_tiny_run_writes_results_and_report(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    overhead.add_arguments(parser)
    out = tmp_path / "overhead"
    args = parser.parse_args(
        [
            "--harness",
            "python",
            "--quick",
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
            "--concurrency",
            "1,4",
            "--stream-chunks",
            "8",
            "--out",
            str(out),
            "--no-peers",
        ]
    )
    assert overhead.run(args) == 0
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    cells = [(r["target"], r["concurrency"], r["stream"]) for r in rows]
    targets = (DIRECT, GATEWAY, GATEWAY_GRPC)
    assert cells == [(t, c, s) for s in (False, True) for c in (1, 4) for t in targets]
    for row in rows:
        assert row.keys() >= ROW_FIELDS
        assert row["errors"] == 0, (row["target"], row["error_kinds"])
        assert row["requests"] > 0
        assert row["loadgen_cpu_us_per_request"] > 0
        assert (row["chunks_per_s"] is not None) == row["stream"]
        assert (row["ttfc_p50_ms"] is not None) == row["stream"]
        http_stream = row["stream"] and row["target"] != GATEWAY_GRPC
        assert (row["http_chunks_per_s"] is not None) == http_stream
    assert results["parameters"]["concurrency"] == [1, 4]
    assert results["parameters"]["grpc_clients"] == 2
    assert results["machine"]["cpus_usable"] >= 1
    assert results["parameters"]["peers"] == []
    peers = {r["name"]: r["status"] for r in results["peers"]}
    assert peers == {name: "not run: --no-peers" for name in overhead.DEFAULT_PEERS}
    assert [t["passed"] is None for t in results["targets"]] == [False, True, False]
    assert len(results["rounds"]) == len(rows)
    report = (out / "report.md").read_text()
    assert "| target | c | stream |" in report
    assert "## Targets" in report
    assert "rps_ratio_vs_direct" in report
    assert "| gateway-grpc | 4 | yes |" in report
    assert "direct baseline of the gRPC rows is the direct HTTP round" in report
    assert re.search(r"\| vllm-router:round_robin \| [^|]+ \| not run: --no-peers \|", report)
