"""The fleet under test: simulated replicas in a child process, or real vLLM CPU replicas."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.procs import stop_process
from benchmarks.routing_bench.contenders import FleetInfo
from benchmarks.routing_bench.workloads import FleetSize, Words

_REPO = Path(__file__).resolve().parents[2]
_START_TIMEOUT_S = 60.0
_HTTP_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
# vLLM's metric names (v1); counters carry the _total suffix on the wire.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
PREEMPTIONS = "vllm:num_preemptions_total"
SUCCESS = "vllm:request_success_total"
_WANTED = (RUNNING, WAITING, HITS, QUERIES, PREEMPTIONS)


class FleetError(Exception):
    """The fleet could not start, or one of its replicas stopped answering."""


@dataclass(frozen=True, slots=True)
class SimParams:
    """The simulator knobs the benchmark sets (everything else: SimConfig defaults)."""

    replicas: int = 8
    num_gpu_blocks: int = 1024
    block_size: int = 16
    time_scale: float = 1.0
    stream_interval: int = 8
    max_num_seqs: int = 256
    seed: int = 0

    def args(self) -> list[str]:
        return [
            "--replicas",
            str(self.replicas),
            "--num-gpu-blocks",
            str(self.num_gpu_blocks),
            "--block-size",
            str(self.block_size),
            "--time-scale",
            str(self.time_scale),
            "--stream-interval",
            str(self.stream_interval),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--seed",
            str(self.seed),
            "--kv-events",
            "true",
        ]


@dataclass
class RunningFleet:
    """A started fleet: how contenders reach it, its size, and the processes to account CPU for."""

    info: FleetInfo
    size: FleetSize
    params: dict[str, Any]
    _pids: list[int] = field(default_factory=list)
    _proc: asyncio.subprocess.Process | None = None
    _closer: Any = None

    def pids(self) -> list[int]:
        return list(self._pids)

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        await stop_process(proc)
        closer, self._closer = self._closer, None
        if closer is not None:
            await closer.__aexit__(None, None, None)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-2000:]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH", "")) if p)
    return env


async def start_sim(p: SimParams, log: Path) -> RunningFleet:
    """`python -m simulator` in a child process; wait for its 'ready' line."""
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "simulator",
            *p.args(),
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=_env(),
            cwd=_REPO,
        )
    assert proc.stdout is not None
    urls: list[str] = []
    kv: list[str | None] = []
    try:
        async with asyncio.timeout(_START_TIMEOUT_S):
            while True:
                line = (await proc.stdout.readline()).decode().strip()
                if not line:
                    raise FleetError(f"simulator exited: {_tail(log)}")
                if line == "ready":
                    break
                parts = line.split()
                urls.append(parts[1])
                ep = parts[2].split("=", 1)[1]
                kv.append(None if ep == "None" else ep)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    info = FleetInfo(tuple(urls), "sim-llama-3-8b", tuple(kv), "builtin", p.block_size, "sim")
    size = FleetSize(p.replicas, p.num_gpu_blocks, p.block_size)
    params = {"fleet": "sim", **{k: getattr(p, k) for k in p.__dataclass_fields__}}
    return RunningFleet(info, size, params, [proc.pid], proc)


async def start_vllm_cpu(
    replicas: int, num_gpu_blocks: int, block_size: int, max_model_len: int = 1024
) -> RunningFleet:
    """Real vLLM CPU replicas from benchmarks.vllm_cpu (imported only when asked for)."""
    try:
        from benchmarks.vllm_cpu import VllmFleet
    except ImportError as exc:
        raise FleetError(
            f"--fleet vllm-cpu needs benchmarks.vllm_cpu.VllmFleet, which is unavailable ({exc}); "
            "prepare it with `python -m benchmarks.vllm_cpu prepare`"
        ) from None
    fleet = VllmFleet(
        replicas,
        base_port=0,
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        # The launcher's default context; long prompts need more (bench replay).
        max_model_len=max_model_len,
        kv_events=True,
    )
    try:
        await fleet.__aenter__()
    except Exception as exc:
        raise FleetError(f"vLLM CPU fleet did not start: {exc}") from None
    reps = list(fleet.replicas)
    pids = [pid for r in reps if (pid := _pid_of(r)) is not None]
    info = FleetInfo(
        tuple(r.url for r in reps),
        str(fleet.model),
        tuple(getattr(r, "kv_events_endpoint", None) for r in reps),
        str(getattr(fleet, "model_dir", "")) or None,
        block_size,
        "vllm-cpu",
    )
    size = FleetSize(replicas, num_gpu_blocks, block_size, _word_tokens(info.tokenizer))
    params = {
        "fleet": "vllm-cpu",
        "word_tokens": size.word_tokens,
        "replicas": replicas,
        "num_gpu_blocks": num_gpu_blocks,
        "block_size": block_size,
        "time_scale": 1.0,
    }
    return RunningFleet(info, size, params, pids, None, fleet)


def _word_tokens(tokenizer_dir: str | None) -> float:
    """Model tokens per workload word, so working sets are sized in the fleet's own tokens."""
    if not tokenizer_dir:
        return 1.0
    from vllm_api.tokenizer import load_tokenizer

    sample = Words().text(random.Random(0), 1000)
    return round(len(load_tokenizer(tokenizer_dir).encode_plain(sample)) / 1000, 2)


def _pid_of(replica: Any) -> int | None:
    for attr in ("pid", "proc", "process"):
        v = getattr(replica, attr, None)
        if isinstance(v, int):
            return v
        if v is not None and isinstance(getattr(v, "pid", None), int):
            return int(v.pid)
    return None


def parse_metrics(text: str, names: Sequence[str] = _WANTED) -> dict[str, float]:
    """The few vLLM series the benchmark reads (`names`), summed over label sets."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            with contextlib.suppress(ValueError, IndexError):
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


async def scrape(
    session: aiohttp.ClientSession, urls: tuple[str, ...], names: Sequence[str] = _WANTED
) -> list[dict[str, float]]:
    """Every replica's counters and gauges (`names`), in replica order."""

    async def one(url: str) -> dict[str, float]:
        async with session.get(f"{url}/metrics", timeout=_HTTP_TIMEOUT) as resp:
            return parse_metrics(await resp.text(), names)

    return list(await asyncio.gather(*(one(u) for u in urls)))


async def reset_caches(session: aiohttp.ClientSession, urls: tuple[str, ...]) -> None:
    """POST /reset_prefix_cache on every replica (vLLM's own route) so the next run starts cold."""
    for url in urls:
        async with session.post(f"{url}/reset_prefix_cache", timeout=_HTTP_TIMEOUT) as resp:
            if resp.status != 200:
                raise FleetError(f"{url}/reset_prefix_cache answered {resp.status}")


async def replica_of_requests(
    session: aiohttp.ClientSession, urls: tuple[str, ...]
) -> dict[str, int]:
    """Request id -> replica index, from the simulator's /_sim/timings (sim fleets only)."""
    out: dict[str, int] = {}
    for i, url in enumerate(urls):
        async with session.get(f"{url}/_sim/timings", timeout=_HTTP_TIMEOUT) as resp:
            if resp.status != 200:
                return {}
            for rec in await resp.json():
                rid = str(rec[0])
                out[rid.split("-", 1)[1] if "-" in rid else rid] = i
    return out
