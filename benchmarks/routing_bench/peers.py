"""Peer routers (SGLang's, vLLM's, LiteLLM's) as benchmark contenders, each in a venv of its own.

`python -m benchmarks.routing_bench.peers setup` installs them (idempotent, a marker per peer);
`... status` says what is installed. Nothing they run may leave loopback: see docs/peers.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.procs import STOP_TIMEOUT_S, descendants, http_status
from benchmarks.routing_bench.contenders import ContenderUnavailable, FleetInfo

HOST = "127.0.0.1"
MASTER_KEY = "sk-llmgw-bench"  # LiteLLM refuses to start without one; it never leaves loopback
_POLL_S = 0.1
_TAIL_CHARS = 1500


@dataclass(frozen=True, slots=True)
class PeerPackage:
    """A peer's PyPI requirement (pinned to the version checked here) and its console script."""

    name: str
    requirement: str
    dist: str
    executable: str


PACKAGES: dict[str, PeerPackage] = {
    p.name: p
    for p in (
        PeerPackage("sglang-router", "sglang-router==0.3.2", "sglang-router", "sglang-router"),
        PeerPackage("vllm-router", "vllm-router==0.1.17", "vllm-router", "vllm-router"),
        PeerPackage("litellm", "litellm[proxy]==1.108.7", "litellm", "litellm"),
    )
}


def cache_dir() -> Path:
    """`${LLMGW_CACHE:-~/.cache/llm-gateway}/peers`: outside the checkout, shared by runs."""
    root = os.environ.get("LLMGW_CACHE") or str(Path.home() / ".cache" / "llm-gateway")
    return Path(root) / "peers"


def venv_dir(pkg: PeerPackage) -> Path:
    return cache_dir() / pkg.name / "venv"


def marker_path(pkg: PeerPackage) -> Path:
    return cache_dir() / pkg.name / "installed.json"


def installed(pkg: PeerPackage) -> dict[str, str] | None:
    """The setup marker (requirement, version, date), or None when setup has not completed."""
    try:
        data = json.loads(marker_path(pkg).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "version" in data else None


def _install(pkg: PeerPackage, python: str, force: bool) -> str:
    mark = installed(pkg)
    if mark is not None and mark.get("requirement") == pkg.requirement and not force:
        return f"{pkg.name}: already installed ({mark['version']})"
    venv = venv_dir(pkg)
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = venv.parent / "install.log"
    marker_path(pkg).unlink(missing_ok=True)
    vpy = str(venv / "bin" / "python")
    steps = [
        [python, "-m", "venv", str(venv)],
        [vpy, "-m", "pip", "install", "--quiet", pkg.requirement],
    ]
    with log.open("wb") as out:
        for cmd in steps:
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode:
                return f"{pkg.name}: FAILED ({' '.join(cmd[-2:])}), see {log}"
    probe = f"import importlib.metadata as m; print(m.version({pkg.dist!r}))"
    got = subprocess.run([vpy, "-c", probe], capture_output=True, text=True, check=False)
    version = got.stdout.strip()
    if got.returncode or not version:
        return f"{pkg.name}: FAILED (no {pkg.dist} in the venv), see {log}"
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    mark = {"requirement": pkg.requirement, "version": version, "installed": when}
    marker_path(pkg).write_text(json.dumps(mark, indent=1) + "\n")
    return f"{pkg.name}: installed {version} into {venv}"


def setup(names: Sequence[str] = (), force: bool = False, python: str = sys.executable) -> bool:
    """Install the named peers (all by default) in parallel; True when every one is installed."""
    pkgs = [PACKAGES[n] for n in names] if names else list(PACKAGES.values())
    with ThreadPoolExecutor(max_workers=len(pkgs)) as pool:
        for line in pool.map(lambda p: _install(p, python, force), pkgs):
            print(line, flush=True)
    return all(installed(p) is not None for p in pkgs)


def sglang_argv(exe: str, policy: str, fleet: FleetInfo, port: int, metrics_port: int) -> list[str]:
    """SGLang's router on loopback; its default `sglang` backend proxies vLLM's OpenAI routes."""
    return [
        exe, "launch", "--host", HOST, "--port", str(port), "--worker-urls", *fleet.urls,
        "--policy", policy, "--prometheus-host", HOST, "--prometheus-port", str(metrics_port),
        "--log-level", "warn",
    ]  # fmt: skip


def vllm_router_argv(
    exe: str, policy: str, fleet: FleetInfo, port: int, metrics_port: int
) -> list[str]:
    """vLLM's router on loopback (`warning`, not `warn`: it rejects the latter)."""
    return [
        exe, "--host", HOST, "--port", str(port), "--worker-urls", *fleet.urls,
        "--policy", policy, "--prometheus-host", HOST, "--prometheus-port", str(metrics_port),
        "--log-level", "warning",
    ]  # fmt: skip


def litellm_config(fleet: FleetInfo, strategy: str) -> str:
    """LiteLLM proxy config (JSON is YAML): one deployment per replica, no DB, no downloads."""
    config = {
        "model_list": [
            {
                "model_name": fleet.model,
                "litellm_params": {
                    "model": f"openai/{fleet.model}",
                    "api_base": f"{url}/v1",
                    "api_key": "unused",
                },
            }
            for url in fleet.urls
        ],
        "router_settings": {"routing_strategy": strategy},
        # Forwarding x-* headers carries x-request-id to the replica, as the other peers do:
        # the benchmark joins its records with the replicas' by it.
        "general_settings": {"master_key": MASTER_KEY, "forward_client_headers_to_llm_api": True},
        # A model named like "llama-3" makes LiteLLM fetch a Hub tokenizer on every request.
        "litellm_settings": {"telemetry": False, "disable_hf_tokenizer_download": True},
    }
    return json.dumps(config, indent=1)


def litellm_argv(exe: str, config: Path, port: int) -> list[str]:
    return [exe, "--config", str(config), "--host", HOST, "--port", str(port)]


def peer_env(venv: Path, extra: Mapping[str, str] = {}) -> dict[str, str]:
    """A minimal environment: no proxies inherited, Hugging Face offline, loopback exempted."""
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(Path.home()),
        "LANG": "C.UTF-8",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
    }
    env.update(extra)
    return env


# Without it LiteLLM answers 500 (not 401): its error handler imports prisma, which is absent.
LITELLM_HEADERS = {"Authorization": f"Bearer {MASTER_KEY}"}
_LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else it fetches a price list at start
    "LITELLM_TELEMETRY": "False",
    "LITELLM_LOG": "ERROR",
    "LITELLM_MODE": "PRODUCTION",  # no .env loading
}


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start one peer and how to tell it is ready."""

    argv: list[str]
    env: dict[str, str]
    ready_path: str
    headers: dict[str, str] = field(default_factory=dict)  # every client request carries them


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _rust_router(
    build: Callable[[str, str, FleetInfo, int, int], list[str]],
) -> Callable[[PeerPackage, str, FleetInfo, int, Path], Launch]:
    def launch(pkg: PeerPackage, policy: str, fleet: FleetInfo, port: int, work: Path) -> Launch:
        exe = str(venv_dir(pkg) / "bin" / pkg.executable)
        argv = build(exe, policy, fleet, port, _free_port())
        return Launch(argv, peer_env(venv_dir(pkg)), "/health")

    return launch


def _litellm(pkg: PeerPackage, strategy: str, fleet: FleetInfo, port: int, work: Path) -> Launch:
    config = work / "litellm.yaml"
    config.write_text(litellm_config(fleet, strategy))
    exe = str(venv_dir(pkg) / "bin" / pkg.executable)
    # /v1/models answers only once the config's deployments are loaded.
    env = peer_env(venv_dir(pkg), _LITELLM_ENV)
    return Launch(litellm_argv(exe, config, port), env, "/v1/models", LITELLM_HEADERS)


class PeerContender:
    """One peer with one policy, started in its own process group so stop() reaps all of it."""

    def __init__(
        self,
        name: str,
        pkg: PeerPackage,
        policy: str,
        launch: Callable[[PeerPackage, str, FleetInfo, int, Path], Launch],
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        headers: Mapping[str, str] = {},
    ) -> None:
        self.name = name
        # Headers the load generator must add to every request (LiteLLM's master key).
        self.headers = dict(headers)
        self.pkg = pkg
        self.policy = policy
        self._launch = launch
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._log: Path | None = None

    def launch_spec(self, fleet: FleetInfo, port: int, work: Path) -> Launch:
        return self._launch(self.pkg, self.policy, fleet, port, work)

    def version(self) -> str | None:
        mark = installed(self.pkg)
        return None if mark is None else mark["version"]

    def _tail(self) -> str:
        try:
            return self._log.read_text(errors="replace")[-_TAIL_CHARS:] if self._log else ""
        except OSError:
            return ""

    async def start(self, fleet: FleetInfo) -> str:
        if installed(self.pkg) is None:
            raise ContenderUnavailable(
                f"{self.pkg.name} is not installed (no {marker_path(self.pkg)}): run "
                f"`python -m benchmarks.routing_bench.peers setup {self.pkg.name}`"
            )
        if not (venv_dir(self.pkg) / "bin" / self.pkg.executable).exists():
            raise ContenderUnavailable(
                f"{self.pkg.name} install is broken (no bin/{self.pkg.executable}): run "
                f"`python -m benchmarks.routing_bench.peers setup --force {self.pkg.name}`"
            )
        self._tmp = tempfile.TemporaryDirectory(prefix=f"llmgw-peer-{self.pkg.name}-")
        work = Path(self._tmp.name)
        port = _free_port()
        spec = self.launch_spec(fleet, port, work)
        self._log = work / "peer.log"
        with self._log.open("wb") as log:
            self._proc = await asyncio.create_subprocess_exec(
                *spec.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=spec.env, cwd=work, start_new_session=True,
            )  # fmt: skip
        try:
            await self._wait_ready(port, spec)
        except BaseException:
            await self.stop()
            raise
        return f"http://{HOST}:{port}"

    async def _wait_ready(self, port: int, spec: Launch) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self._proc.returncode is not None:
                raise ContenderUnavailable(
                    f"{self.name} exited with code {self._proc.returncode}: {self._tail()}"
                )
            try:
                async with asyncio.timeout(2.0):
                    code = await http_status(HOST, port, spec.ready_path, spec.headers)
                if code == 200:
                    return
                last = f"HTTP {code}"
            except (OSError, TimeoutError, ValueError, IndexError) as exc:
                last = repr(exc)
            await asyncio.sleep(_POLL_S)  # polling readiness under a deadline
        raise ContenderUnavailable(
            f"{self.name} not ready on {spec.ready_path} in {self.start_timeout_s:g} s "
            f"({last}): {self._tail()}"
        )

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            await self._signal_and_wait(proc, signal.SIGTERM, self.stop_timeout_s)
            if proc.returncode is None:
                await self._signal_and_wait(proc, signal.SIGKILL, self.stop_timeout_s)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self._log = None

    @staticmethod
    async def _signal_and_wait(proc: asyncio.subprocess.Process, sig: int, within: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # the whole group: LiteLLM may fork workers
        try:
            async with asyncio.timeout(within):
                await proc.wait()
        except TimeoutError:
            pass

    def pids(self) -> list[int]:
        p = self._proc
        if p is None or p.returncode is not None:
            return []
        return [p.pid, *descendants(p.pid)]


_SGLANG = _rust_router(sglang_argv)
_VLLM_ROUTER = _rust_router(vllm_router_argv)

# (contender name, package, policy, launcher, start deadline, client headers).
# LiteLLM takes 10-25 s to import here on 2 shared cores; the Rust routers about 1 s.
CATALOGUE: tuple[tuple[str, str, str, Callable[..., Launch], float, Mapping[str, str]], ...] = (
    ("sglang:cache_aware", "sglang-router", "cache_aware", _SGLANG, 30.0, {}),
    ("sglang:round_robin", "sglang-router", "round_robin", _SGLANG, 30.0, {}),
    ("vllm-router:cache_aware", "vllm-router", "cache_aware", _VLLM_ROUTER, 30.0, {}),
    ("vllm-router:consistent_hash", "vllm-router", "consistent_hash", _VLLM_ROUTER, 30.0, {}),
    ("vllm-router:round_robin", "vllm-router", "round_robin", _VLLM_ROUTER, 30.0, {}),
    ("litellm:least-busy", "litellm", "least-busy", _litellm, 120.0, LITELLM_HEADERS),
)


# Left out of a default run, with the reason the report gives (runnable by name).
NOT_BY_DEFAULT: Mapping[str, str] = {
    "vllm-router:round_robin": "not selected: the same policy as sglang:round_robin and ours, "
    "measured identical in benchmarks/results/2026-11-29b-routing-sim; run it with --peers",
}


def peer_names(names: Sequence[str] | None = None) -> list[str]:
    """The peers a run starts: those named, or the catalogue less NOT_BY_DEFAULT."""
    known = [c[0] for c in CATALOGUE]
    if names is not None:
        return [n for n in known if n in names]
    return [n for n in known if n not in NOT_BY_DEFAULT]


def peer_contenders(names: Sequence[str] | None = None) -> list[PeerContender]:
    """The peers a run starts (peer_names), installed or not: start() reports what is missing."""
    chosen = peer_names(names)
    return [
        PeerContender(name, PACKAGES[pkg], policy, launch, timeout, headers=headers)
        for name, pkg, policy, launch, timeout, headers in CATALOGUE
        if name in chosen
    ]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.routing_bench.peers")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("setup", help="install the peers into venvs under the cache dir")
    st.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(PACKAGES)}")
    st.add_argument("--force", action="store_true", help="reinstall even if the marker exists")
    sub.add_parser("status", help="which peers are installed, and their versions")
    args = ap.parse_args(argv)
    if args.cmd == "setup":
        unknown = [n for n in args.names if n not in PACKAGES]
        if unknown:
            ap.error(f"unknown peer(s) {unknown}; known: {', '.join(PACKAGES)}")
        return 0 if setup(args.names, args.force) else 1
    for pkg in PACKAGES.values():
        mark = installed(pkg)
        print(f"{pkg.name}: {mark['version'] if mark else 'not installed'} ({venv_dir(pkg)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
