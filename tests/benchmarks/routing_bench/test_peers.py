"""Peer contenders: command lines, unavailability reasons, process handling, and real proxying.

The proxying tests follow the install state: a peer whose setup marker exists must proxy streamed
chat completions to a 2-replica simulated fleet; one without it must say it is not installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from benchmarks.routing_bench import peers
from benchmarks.routing_bench.contenders import ContenderUnavailable, FleetInfo
from benchmarks.routing_bench.peers import (
    CATALOGUE,
    HOST,
    MASTER_KEY,
    NOT_BY_DEFAULT,
    PACKAGES,
    PeerContender,
    installed,
    litellm_config,
    marker_path,
    peer_contenders,
    sglang_argv,
    venv_dir,
    vllm_router_argv,
)
from simulator import SimConfig, SimFleet

FLEET = FleetInfo(
    urls=("http://127.0.0.1:8001", "http://127.0.0.1:8002"),
    model="sim-llama-3-8b",
    kv_endpoints=(None, None),
    tokenizer="builtin",
    block_size=16,
    fleet="sim",
)
# Captured before any test points LLMGW_CACHE elsewhere: the real install state.
REAL_INSTALLS = {name: installed(pkg) is not None for name, pkg in PACKAGES.items()}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("LLMGW_CACHE", str(tmp_path))
    yield tmp_path / "peers"


# ---- command lines and configs -------------------------------------------------------------------


def test_catalogue_names_and_policies() -> None:
    assert [c[0] for c in CATALOGUE] == [
        "sglang:cache_aware",
        "sglang:round_robin",
        "vllm-router:cache_aware",
        "vllm-router:consistent_hash",
        "vllm-router:round_robin",
        "litellm:least-busy",
    ]
    # A default run leaves out what duplicates another contender's policy, and says why.
    names = [c.name for c in peer_contenders()]
    assert names == [c[0] for c in CATALOGUE if c[0] != "vllm-router:round_robin"]
    assert "same policy" in NOT_BY_DEFAULT["vllm-router:round_robin"]
    assert [c.name for c in peer_contenders(["litellm:least-busy"])] == ["litellm:least-busy"]
    assert [c.name for c in peer_contenders(["vllm-router:round_robin"])] == [
        "vllm-router:round_robin"
    ]
    for c in peer_contenders([c[0] for c in CATALOGUE]):
        assert c.name.split(":")[1] == c.policy


def test_unselected_peers_are_reported_not_dropped() -> None:
    from benchmarks.routing_bench.suite import SuiteConfig, _contenders

    _, missing = _contenders(SuiteConfig(out=Path("unused"), peers=("sglang:cache_aware",)))
    down = {m["contender"]: (m["status"], m["reason"]) for m in missing}
    assert "sglang:cache_aware" not in down
    assert down["litellm:least-busy"] == ("not selected", "not selected (--peers)")
    _, missing = _contenders(SuiteConfig(out=Path("unused")))
    assert [m["contender"] for m in missing] == ["vllm-router:round_robin"]


def test_sglang_command_line() -> None:
    argv = sglang_argv("/x/sglang-router", "cache_aware", FLEET, 4000, 4001)
    assert argv[:2] == ["/x/sglang-router", "launch"]
    i = argv.index("--worker-urls")
    assert argv[i + 1 : i + 3] == list(FLEET.urls)
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    assert argv[argv.index("--host") + 1] == HOST
    assert argv[argv.index("--port") + 1] == "4000"
    assert argv[argv.index("--prometheus-host") + 1] == HOST
    assert argv[argv.index("--prometheus-port") + 1] == "4001"
    assert argv[argv.index("--log-level") + 1] == "warn"


def test_vllm_router_command_line() -> None:
    argv = vllm_router_argv("/x/vllm-router", "consistent_hash", FLEET, 4000, 4001)
    assert argv[0] == "/x/vllm-router" and "launch" not in argv
    i = argv.index("--worker-urls")
    assert argv[i + 1 : i + 3] == list(FLEET.urls)
    assert argv[argv.index("--policy") + 1] == "consistent_hash"
    assert argv[argv.index("--host") + 1] == HOST
    assert argv[argv.index("--prometheus-host") + 1] == HOST
    assert argv[argv.index("--log-level") + 1] == "warning"  # it rejects "warn"


def test_litellm_config_one_deployment_per_replica() -> None:
    cfg = json.loads(litellm_config(FLEET, "least-busy"))
    deployments = cfg["model_list"]
    assert [d["model_name"] for d in deployments] == [FLEET.model] * 2
    assert [d["litellm_params"]["api_base"] for d in deployments] == [f"{u}/v1" for u in FLEET.urls]
    assert {d["litellm_params"]["model"] for d in deployments} == {f"openai/{FLEET.model}"}
    assert cfg["router_settings"] == {"routing_strategy": "least-busy"}
    assert cfg["general_settings"]["master_key"] == MASTER_KEY
    assert cfg["general_settings"]["forward_client_headers_to_llm_api"] is True
    assert cfg["litellm_settings"]["disable_hf_tokenizer_download"] is True
    assert "database_url" not in json.dumps(cfg)


@pytest.mark.parametrize("contender", peer_contenders(), ids=lambda c: c.name)
def test_launch_specs_stay_on_loopback(
    contender: PeerContender, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    spec = contender.launch_spec(FLEET, 5000, tmp_path)
    assert spec.argv[0] == str(venv_dir(contender.pkg) / "bin" / contender.pkg.executable)
    assert str(cache) in spec.argv[0]
    assert not any(k.lower().endswith("_proxy") and k.lower() != "no_proxy" for k in spec.env)
    assert spec.env["HF_HUB_OFFLINE"] == "1"
    assert spec.env["PATH"].startswith(str(venv_dir(contender.pkg) / "bin"))
    text = " ".join(spec.argv)
    if contender.pkg.name == "litellm":
        assert spec.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
        assert spec.headers == contender.headers == {"Authorization": f"Bearer {MASTER_KEY}"}
        text = (tmp_path / "litellm.yaml").read_text()
    else:
        assert spec.ready_path == "/health" and contender.headers == {}
    for url in FLEET.urls:
        assert url in text
    assert "0.0.0.0" not in text


# ---- install state and unavailability ------------------------------------------------------------


def _fake_install(name: str, script: str) -> PeerContender:
    """A setup marker plus a script in the executable's place, to drive the process handling."""
    contender = peer_contenders([name])[0]
    pkg = contender.pkg
    exe = venv_dir(pkg) / "bin" / pkg.executable
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!{sys.executable}\n{script}")
    exe.chmod(0o755)
    marker_path(pkg).write_text(json.dumps({"requirement": pkg.requirement, "version": "9.9"}))
    return contender


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _all_gone(pids: list[int], within: float = 5.0) -> None:
    """Orphaned descendants are reaped by init, not by us: poll with a deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while any(_alive(p) for p in pids):
        assert loop.time() < deadline, f"still alive: {[p for p in pids if _alive(p)]}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("contender", peer_contenders(), ids=lambda c: c.name)
async def test_not_installed_says_how_to_install(contender: PeerContender, cache: Path) -> None:
    with pytest.raises(ContenderUnavailable) as info:
        await contender.start(FLEET)
    assert "not installed" in info.value.reason
    assert f"peers setup {contender.pkg.name}" in info.value.reason
    assert contender.pids() == []


async def test_marker_without_executable_is_broken(cache: Path) -> None:
    pkg = PACKAGES["vllm-router"]
    marker_path(pkg).parent.mkdir(parents=True)
    marker_path(pkg).write_text(json.dumps({"requirement": pkg.requirement, "version": "1"}))
    with pytest.raises(ContenderUnavailable, match="broken"):
        await peer_contenders(["vllm-router:round_robin"])[0].start(FLEET)


def test_installed_ignores_garbage_markers(cache: Path) -> None:
    pkg = PACKAGES["sglang-router"]
    marker_path(pkg).parent.mkdir(parents=True)
    marker_path(pkg).write_text("not json")
    assert installed(pkg) is None
    marker_path(pkg).write_text(json.dumps({"requirement": pkg.requirement, "version": "0.3.2"}))
    assert installed(pkg) == {"requirement": pkg.requirement, "version": "0.3.2"}


def test_setup_is_idempotent_with_a_marker(cache: Path) -> None:
    pkg = PACKAGES["litellm"]
    marker_path(pkg).parent.mkdir(parents=True)
    marker_path(pkg).write_text(json.dumps({"requirement": pkg.requirement, "version": "1.0"}))
    # The python given would fail to create anything: the marker alone must short-circuit.
    assert peers.setup(["litellm"], python="/nonexistent/python") is True
    assert not venv_dir(pkg).exists()


def test_setup_reports_a_failed_install(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert peers.setup(["vllm-router"], python="/bin/false") is False
    assert "vllm-router: FAILED" in capsys.readouterr().out
    assert installed(PACKAGES["vllm-router"]) is None


def test_cli(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert peers.main(["status"]) == 0
    out = capsys.readouterr().out
    for name in PACKAGES:
        assert f"{name}: not installed" in out
    with pytest.raises(SystemExit):
        peers.main(["setup", "nginx"])


async def test_exit_at_start_reports_the_log_tail(cache: Path) -> None:
    c = _fake_install(
        "vllm-router:round_robin", "import sys\nprint('bad flag --frobnicate')\nsys.exit(3)\n"
    )
    with pytest.raises(ContenderUnavailable) as info:
        await c.start(FLEET)
    assert "exited with code 3" in info.value.reason
    assert "bad flag --frobnicate" in info.value.reason


async def test_never_ready_is_reported_and_reaped(cache: Path) -> None:
    script = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n"
    c = _fake_install("vllm-router:round_robin", script)
    c.start_timeout_s = 2.0
    t0 = time.monotonic()
    with pytest.raises(ContenderUnavailable) as info:
        await c.start(FLEET)
    assert time.monotonic() - t0 < 10
    assert "not ready on /health in 2 s" in info.value.reason
    await _all_gone([int(info.value.reason.rsplit(":", 1)[1].split()[0])])


# A peer that is ready, forks a helper, and ignores SIGTERM: stop() must SIGKILL the whole group.
_STUBBORN = """
import http.server, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


async def test_stop_escalates_to_sigkill_and_reaps_children(cache: Path) -> None:
    c = _fake_install("sglang:round_robin", _STUBBORN)
    c.stop_timeout_s = 0.5
    url = await c.start(FLEET)
    assert url.startswith(f"http://{HOST}:")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while len(c.pids()) < 2:  # the helper appears once the script has forked it
        assert loop.time() < deadline, "helper process never appeared"
        await asyncio.sleep(0.02)
    pids = c.pids()
    await c.stop()
    assert c.pids() == []
    await _all_gone(pids)


# ---- the real peers, when installed --------------------------------------------------------------

MAX_TOKENS = 5
DECODE_MS = 40.0


def _body(i: int) -> dict[str, object]:
    # The load generator's request shape; ignore_eos must reach the replica (EOS comes after 2).
    return {
        "model": "sim-llama-3-8b",
        "messages": [
            {"role": "system", "content": "You answer briefly. " * 30},
            {"role": "user", "content": f"question number {i}"},
        ],
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0.0,
        "user": f"user-{i}",
    }


async def _chat(
    session: aiohttp.ClientSession, url: str, rid: str, i: int, headers: dict[str, str]
) -> tuple[list[float], dict[str, object]]:
    times: list[float] = []
    usage: dict[str, object] = {}
    done = False
    hdrs = {"x-request-id": rid, **headers}
    timeout = aiohttp.ClientTimeout(total=30)
    async with session.post(
        f"{url}/v1/chat/completions", json=_body(i), headers=hdrs, timeout=timeout
    ) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                done = True
                break
            obj = json.loads(payload)
            for ch in obj.get("choices") or ():
                if (ch.get("delta") or {}).get("content"):
                    times.append(time.monotonic())
            usage = obj.get("usage") or usage
    assert done
    return times, usage


PROXY_CASES = ["sglang:cache_aware", "sglang:round_robin", "vllm-router:cache_aware"]
PROXY_CASES += ["litellm:least-busy"]


@pytest.mark.parametrize("name", PROXY_CASES)
async def test_installed_peer_proxies_streaming_chat(name: str) -> None:
    contender = peer_contenders([name])[0]
    if not REAL_INSTALLS[contender.pkg.name]:
        with pytest.raises(ContenderUnavailable, match="not installed"):
            await contender.start(FLEET)
        return
    cfg = SimConfig(
        eos_after_tokens=2, decode_base_ms=DECODE_MS, decode_per_seq_ms=0.0, kv_events=False
    )
    async with SimFleet(cfg, replicas=2) as fleet, aiohttp.ClientSession() as session:
        info = FleetInfo(tuple(fleet.urls), cfg.model, (None, None), "builtin", 16, "sim")
        url = await contender.start(info)
        try:
            assert contender.pids()
            # The first request pays LiteLLM's lazy initialisation; measure the later ones.
            for i in range(4):
                times, usage = await _chat(session, url, f"peer-test-{i}", i, contender.headers)
                assert len(times) == MAX_TOKENS
                assert usage.get("completion_tokens") == MAX_TOKENS
            # Streamed as produced, not buffered: tokens arrive spread over the decode steps.
            assert times[-1] - times[0] >= 0.5 * (MAX_TOKENS - 1) * DECODE_MS / 1000
            served = [{t.request_id for t in r.engine.timings} for r in fleet.replicas]
            for i in range(4):  # x-request-id reached a replica: the benchmark joins on it
                assert sum(f"chatcmpl-peer-test-{i}" in s for s in served) == 1
            if name.endswith("round_robin"):
                assert all(len(s) == 2 for s in served)
        finally:
            pids = contender.pids()
            await contender.stop()
        assert contender.pids() == []
        await _all_gone(pids)
