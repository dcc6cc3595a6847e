"""`llm-gateway sim`: run N simulated replicas until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import sys
from typing import Any

from simulator.config import Faults, SimConfig
from simulator.fleet import SimFleet

_HELP = {
    "model": "served model name",
    "lora_adapters": "comma-separated LoRA adapter names served besides the base model",
    "max_lora": "max_lora reported in vllm:lora_requests_info",
    "max_model_len": "context length (prompt + output tokens)",
    "max_num_seqs": "most sequences running at once; the rest wait",
    "max_num_batched_tokens": "prefill token budget per step (at least one request is admitted)",
    "block_size": "tokens per KV-cache block",
    "num_gpu_blocks": "KV-cache blocks per replica (capacity = blocks x block_size tokens)",
    "enable_prefix_caching": "reuse cached prompt blocks",
    "time_scale": "run the whole clock this many times faster",
    "stream_interval": "tokens per SSE chunk (vLLM --stream-interval)",
    "seed": "base seed (replica i uses seed + i for hashing and fault decisions)",
    "tokenizer": "directory with tokenizer.json / tokenizer_config.json (default: builtin)",
    "kv_events": "publish KV-cache events over ZMQ",
    "kv_events_endpoint": "ZMQ endpoint: contains '*' -> bind (fixed port: +i per replica), "
    "else connect",
    "kv_events_topic": "topic frame of KV-event messages",
    "replay": "serve a replay ROUTER socket per replica",
    "replay_buffer_steps": "KV-event batches kept for replay",
    "enable_prompt_tokens_details": "report usage.prompt_tokens_details.cached_tokens",
    "eos_after_tokens": "finish with 'stop' after this many tokens unless ignore_eos",
    "decode_base_ms": "decode step time t0 in ms (step = t0 + a x running)",
    "decode_per_seq_ms": "decode step time a per running sequence, in ms",
    "prefill_base_ms": "prefill overhead per step with prefill, in ms",
    "prefill_per_token_ms": "prefill time per uncached prompt token, in ms",
    "metrics_cost_ms": "API-server time of one /metrics render, in ms; it pushes the engine's "
    "next step back",
    "responses_store": "keep Responses for GET, cancel and previous_response_id "
    "(vLLM: VLLM_ENABLE_RESPONSES_API_STORE=1)",
    "responses_store_size": "stored Responses kept per replica (the oldest are dropped)",
    "runner": "vLLM's --runner: generate (chat, completions, ...) or pooling (embeddings)",
    "embedding_size": "a pooling replica's embedding size",
    "matryoshka": "a pooling replica takes `dimensions` (Matryoshka embeddings)",
}


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text}")


def _opt_int(text: str) -> int | None:
    return None if text.lower() in ("", "none", "null") else int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every SimConfig knob (and every initial fault) as an option, plus fleet placement."""
    parser.add_argument("--replicas", type=int, default=1, help="number of replicas")
    parser.add_argument("--host", default="127.0.0.1", help="listen address")
    parser.add_argument(
        "--base-port", type=int, default=0, help="replica i listens on base+i (0: ephemeral)"
    )
    defaults = SimConfig()
    for f in dataclasses.fields(SimConfig):
        if f.name == "faults":
            continue
        default = getattr(defaults, f.name)
        opt = "--" + f.name.replace("_", "-")
        kind: Any
        if f.name == "lora_adapters":
            kind = str
            default = ""
        elif isinstance(default, bool):
            kind = _bool
        elif f.name in ("tokenizer",):
            kind = str
        elif f.name == "eos_after_tokens":
            kind = _opt_int
        else:
            kind = type(default)
        parser.add_argument(
            opt, type=kind, default=default, help=f"{_HELP[f.name]} (default: {default})"
        )
    for f in dataclasses.fields(Faults):
        default = getattr(Faults(), f.name)
        if isinstance(default, bool):
            kind = _bool
        elif default is None:
            kind = _opt_int
        else:
            kind = type(default)
        parser.add_argument(
            "--fault-" + f.name.replace("_", "-"),
            type=kind,
            default=default,
            help=f"initial fault {f.name}, changeable at /_sim/faults (default: {default})",
        )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(SimConfig):
        if f.name == "faults":
            continue
        kw[f.name] = getattr(args, f.name)
    kw["lora_adapters"] = tuple(a for a in str(args.lora_adapters).split(",") if a)
    faults = Faults(
        **{f.name: getattr(args, "fault_" + f.name) for f in dataclasses.fields(Faults)}
    )
    return SimConfig(**kw, faults=faults)


async def _serve(cfg: SimConfig, args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with SimFleet(
        cfg, replicas=args.replicas, host=args.host, base_port=args.base_port
    ) as fl:
        for r in fl.replicas:
            print(
                f"{r.name} {r.url} kv_events={r.kv_events_endpoint} replay={r.replay_endpoint}",
                flush=True,
            )
        print("ready", flush=True)
        await stop.wait()


def run(args: argparse.Namespace) -> int:
    """Run the fleet until SIGINT/SIGTERM; prints one line per replica, then 'ready'."""
    try:
        cfg = config_from_args(args)
    except Exception as exc:  # bad knob values: report, don't trace
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(cfg, args))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gateway sim", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
