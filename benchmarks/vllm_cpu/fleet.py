"""Start N real vLLM (CPU build) replicas on 127.0.0.1 and stop them cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

import httpx

from benchmarks.vllm_cpu.engine_env import EngineEnv, VllmCpuError, cache_root
from benchmarks.vllm_cpu.lora import LORA_NAME, LORA_RANK
from benchmarks.vllm_cpu.model import MODEL_NAME, lora_dir, model_dir
from benchmarks.vllm_cpu.whisper_model import WHISPER_MAX_LEN, WHISPER_NAME, whisper_dir

# Without one OpenMP thread per replica, two replicas on two cores fight over threads and
# run 15-30x slower; nobind keeps vLLM from pinning every replica to the same cores.
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # /reset_prefix_cache exists only in dev mode.
    "VLLM_SERVER_DEV_MODE": "1",
    # Without it /v1/responses silently ignores store: no GET, cancel or previous_response_id.
    "VLLM_ENABLE_RESPONSES_API_STORE": "1",
}
_LOG_TAIL_LINES = 40

# vLLM's --runner: "pooling" serves the tiny model as an embedding model (--convert embed),
# under its own served name so that a gateway in front of both kinds tells them apart;
# "transcription" serves the tiny Whisper (vLLM picks its transcription task from the model).
Runner = Literal["generate", "pooling", "transcription"]
POOLING_SUFFIX = "-embed"
# Whisper's encoder output (1500 positions) takes KV blocks beside the decoder's 448 tokens:
# 64 blocks of 32 leave vLLM refusing to start ("estimated maximum model length is 224").
WHISPER_MIN_BLOCKS = 256


@dataclass(frozen=True, slots=True)
class VllmReplica:
    """One started replica: where to reach it and where its log is."""

    index: int
    name: str
    port: int
    kv_port: int | None
    replay_port: int | None
    log_path: Path
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def kv_events_endpoint(self) -> str | None:
        """Connectable form of the publisher (it binds tcp://*:PORT)."""
        return None if self.kv_port is None else f"tcp://127.0.0.1:{self.kv_port}"

    @property
    def replay_endpoint(self) -> str | None:
        return None if self.replay_port is None else f"tcp://127.0.0.1:{self.replay_port}"


# Below Linux's ephemeral range (32768-60999): vLLM's own processes bind ephemeral ports while
# starting, and one of them once took a port picked for a replica between the pick and the
# replica's bind ("Address already in use"). Ports from here are only ever ours.
_PORT_RANGE = (20000, 32000)
_given: set[int] = set()


def free_port() -> int:
    """A port outside the ephemeral range, free a moment ago and not handed out before."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(*_PORT_RANGE)
        if port in _given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise VllmCpuError(f"no free port in {_PORT_RANGE}")


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """The log's last lines, after its ERROR lines (the root cause precedes the traceback)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    all_lines = text.splitlines()
    errors = [line for line in all_lines if " ERROR " in line][:10]
    head = ["ERROR lines:", *errors, "last lines:"] if errors else []
    return "\n".join(head + all_lines[-lines:])


class VllmFleet:
    """N `vllm.entrypoints.openai.api_server` processes; an async context manager.

    Args: n: replicas (keep <= 2 on a 2-core machine). base_port: 0 = ephemeral ports, else
    HTTP base_port+i, KV events base_port+100+i, replay base_port+200+i.
    num_gpu_blocks: KV blocks per replica (bounds the cache so eviction happens).
    block_size: tokens per block (CPU needs a multiple of 32). max_model_len: context length.
    kv_events: publish KV-cache events over ZMQ. lora: serve the tiny LoRA adapter too.
    startup_timeout_s: deadline for every replica to answer /health.
    runner: "generate", or "pooling" (the tiny model converted to an embedding model, served
    as MODEL_NAME + "-embed", started without KV events or LoRA: nothing here uses them), or
    "transcription" (the tiny Whisper as WHISPER_NAME, likewise; max_model_len <= 448 and
    num_gpu_blocks >= WHISPER_MIN_BLOCKS).
    """

    def __init__(
        self,
        n: int = 2,
        base_port: int = 0,
        *,
        num_gpu_blocks: int = 96,
        block_size: int = 32,
        max_model_len: int = 1024,
        max_num_seqs: int = 16,
        kv_events: bool = True,
        lora: bool = True,
        startup_timeout_s: float = 300.0,
        root: Path | None = None,
        log_dir: Path | None = None,
        extra_args: tuple[str, ...] = (),
        runner: Runner = "generate",
    ) -> None:
        if n < 1:
            raise VllmCpuError("n must be >= 1")
        if block_size % 32:
            raise VllmCpuError("the CPU backend needs a block size that is a multiple of 32")
        if num_gpu_blocks * block_size < max_model_len:
            raise VllmCpuError("num_gpu_blocks * block_size must hold max_model_len tokens")
        if runner != "generate" and (kv_events or lora):
            raise VllmCpuError(f"a {runner} replica is started with neither kv_events nor lora")
        if runner == "transcription" and (
            max_model_len > WHISPER_MAX_LEN or num_gpu_blocks < WHISPER_MIN_BLOCKS
        ):
            raise VllmCpuError(
                f"a transcription replica needs max_model_len <= {WHISPER_MAX_LEN} and "
                f"num_gpu_blocks >= {WHISPER_MIN_BLOCKS}"
            )
        self.runner: Runner = runner
        self.n = n
        self.base_port = base_port
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.kv_events = kv_events
        self.lora = lora
        self.startup_timeout_s = startup_timeout_s
        self.root = root or cache_root()
        self.engine = EngineEnv(self.root)
        self.model = {"generate": MODEL_NAME, "pooling": MODEL_NAME + POOLING_SUFFIX}.get(
            runner, WHISPER_NAME
        )
        self.model_dir = (
            whisper_dir(self.root) if runner == "transcription" else model_dir(self.root)
        )
        self.lora_name = LORA_NAME if lora else None
        self._log_dir = log_dir
        self._extra = extra_args
        self.replicas: list[VllmReplica] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._run_dir: Path | None = None

    @property
    def kv_events_endpoint(self) -> str | None:
        """Replica 0's connectable KV-event endpoint (each replica has its own)."""
        return self.replicas[0].kv_events_endpoint if self.replicas else None

    def _ports(self, i: int) -> tuple[int, int | None, int | None]:
        if self.base_port:
            http, kv, replay = (
                self.base_port + i,
                self.base_port + 100 + i,
                self.base_port + 200 + i,
            )
        else:
            http, kv, replay = free_port(), free_port(), free_port()
        return http, (kv if self.kv_events else None), (replay if self.kv_events else None)

    def command(self, port: int, kv_port: int | None, replay_port: int | None) -> list[str]:
        """The api_server command line of one replica."""
        cmd = [
            str(self.engine.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.model,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--load-format", "dummy",
            "--seed", "0",
            "--block-size", str(self.block_size),
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--num-gpu-blocks-override", str(self.num_gpu_blocks),
            "--enable-prompt-tokens-details",
            "--enable-server-load-tracking",
        ]  # fmt: skip
        if self.runner == "pooling":
            cmd += ["--runner", "pooling", "--convert", "embed"]
        elif self.runner == "generate":
            cmd.append("--enable-prefix-caching")
        if kv_port is not None:
            cfg = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://*:{kv_port}",
                "replay_endpoint": f"tcp://*:{replay_port}",
                "topic": "kv",
            }
            cmd += ["--kv-events-config", json.dumps(cfg)]
        if self.lora:
            cmd += [
                "--enable-lora",
                "--max-loras", "1",
                "--max-lora-rank", str(LORA_RANK),
                "--lora-modules", f"{LORA_NAME}={lora_dir(self.root)}",
            ]  # fmt: skip
        return cmd + list(self._extra)

    def _check_ready(self) -> None:
        if not self.engine.ready():
            raise VllmCpuError(
                f"the vLLM engine environment is missing ({self.engine.venv}): "
                "run `python -m benchmarks.vllm_cpu prepare` first"
            )
        if not (self.model_dir / "READY").is_file():
            raise VllmCpuError(
                f"the tiny model is missing ({self.model_dir}): "
                "run `python -m benchmarks.vllm_cpu prepare` first"
            )
        if self.runner == "transcription" and not self.engine.audio_marker.is_file():
            raise VllmCpuError(
                f"the engine's audio extras are missing ({self.engine.venv}): "
                "run `python -m benchmarks.vllm_cpu prepare` first"
            )

    def _spawn(
        self, i: int, log_dir: Path, ports: tuple[int, int | None, int | None] | None = None
    ) -> VllmReplica:
        port, kv_port, replay_port = ports or self._ports(i)
        log_path = log_dir / f"vllm-{i}.log"
        env = {**os.environ, **ENGINE_ENV}
        env.pop("VIRTUAL_ENV", None)
        # A restart appends: the killed process's last lines stay readable above the new ones.
        with log_path.open("ab" if ports else "wb") as log:
            proc = subprocess.Popen(
                self.command(port, kv_port, replay_port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(log_dir),
                # Own process group: the engine core is a child process, stop both together.
                start_new_session=True,
            )
        if ports is None:
            self._procs.append(proc)
        else:
            self._procs[i] = proc
        return VllmReplica(i, f"vllm-{i}", port, kv_port, replay_port, log_path, proc.pid)

    async def _wait_healthy(self, replica: VllmReplica, proc: subprocess.Popen[bytes]) -> float:
        started = time.monotonic()
        deadline = started + self.startup_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                if proc.poll() is not None:
                    raise VllmCpuError(
                        f"replica {replica.name} exited with code {proc.returncode} during "
                        f"start-up; last lines of {replica.log_path}:\n{log_tail(replica.log_path)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(replica.url + "/health")).status_code == 200:
                        return time.monotonic() - started
                if time.monotonic() > deadline:
                    raise VllmCpuError(
                        f"replica {replica.name} not healthy after {self.startup_timeout_s:.0f}s; "
                        f"last lines of {replica.log_path}:\n{log_tail(replica.log_path)}"
                    )
                await asyncio.sleep(0.5)

    async def start(self) -> list[float]:
        """Start every replica and wait for all to be healthy; returns seconds to healthy."""
        self._check_ready()
        log_dir = self._log_dir or Path(tempfile.mkdtemp(prefix="llmgw-vllm-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self._run_dir = log_dir
        try:
            self.replicas = [self._spawn(i, log_dir) for i in range(self.n)]
            return list(
                await asyncio.gather(
                    *(
                        self._wait_healthy(r, p)
                        for r, p in zip(self.replicas, self._procs, strict=True)
                    )
                )
            )
        except BaseException:
            await self.stop()
            raise

    def alive(self, i: int) -> bool:
        """Whether replica i's server process is running."""
        return i < len(self._procs) and self._procs[i].poll() is None

    async def kill(self, i: int) -> None:
        """SIGKILL replica i's process group (server and engine core): no drain, no goodbye."""
        if not self.alive(i):
            raise VllmCpuError(f"replica {i} is not running")
        proc = self._procs[i]
        _signal_group(proc, signal.SIGKILL)
        await asyncio.to_thread(proc.wait)

    async def restart(self, i: int) -> float:
        """Start replica i again on its own ports, after kill(i); seconds until healthy."""
        if self._run_dir is None or i >= len(self.replicas):
            raise VllmCpuError(f"replica {i} was never started")
        if self.alive(i):
            raise VllmCpuError(f"replica {i} is still running: kill it first")
        old = self.replicas[i]
        # The group too: an orphaned engine core would hold the old one's memory.
        _signal_group(self._procs[i], signal.SIGKILL)
        self.replicas[i] = replica = self._spawn(
            i, self._run_dir, (old.port, old.kv_port, old.replay_port)
        )
        try:
            return await self._wait_healthy(replica, self._procs[i])
        except BaseException:
            _signal_group(self._procs[i], signal.SIGKILL)
            raise

    async def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM every replica's process group, then SIGKILL what is left after `grace_s`."""
        procs, self._procs = self._procs, []
        for proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.wait, max(0.0, deadline - time.monotonic()))
            # The group too: an engine-core child must not outlive its server.
            _signal_group(proc, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)

    async def __aenter__(self) -> VllmFleet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
