"""The `llm-gateway` command: serve, demo, check-config, sim, bench."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import sys
from collections.abc import AsyncIterator, Callable, Sequence

from gateway.config import (
    CacheIndexConfig,
    GatewayConfig,
    ReplicaConfig,
    ServerConfig,
    load_config,
)
from gateway.config_loader import ConfigError
from gateway.grpc.config import GrpcConfig
from gateway.logs import setup_logging


def _setup_logging(level: str) -> None:
    setup_logging(level)


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _workers(value: str) -> int:
    """`--workers`: a count >= 1, or `auto` (0: one per core)."""
    if value == "auto":
        return 0
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a count >= 1 or 'auto', got {value!r}")
    return count


def _cmd_serve(args: argparse.Namespace) -> int:
    from gateway.process import serve
    from gateway.runtime import build_router
    from gateway.supervisor import worker_count

    cfg = load_config(args.config)
    setup_logging(args.log_level, cfg.telemetry.log_format)
    build_router(cfg)  # plugin errors surface before any socket opens
    workers = worker_count(cfg.server.workers if args.workers is None else args.workers)
    _install_uvloop()
    if workers == 1:
        asyncio.run(serve(cfg, args.log_level, args.config))
        return 0
    from gateway.supervisor import WorkerStartError, supervise

    try:
        return asyncio.run(supervise(cfg, workers, args.log_level, args.config))
    except (OSError, WorkerStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _cmd_check_config(args: argparse.Namespace) -> int:
    from gateway.runtime import build_router

    cfg = load_config(args.config)
    router = build_router(cfg)
    print(
        f"{args.config}: OK ({len(cfg.replicas)} replicas, routing profile {router.profile_name!r})"
    )
    return 0


# The demo's embedding model, served by a simulated pooling replica.
DEMO_EMBED_MODEL = "sim-embed"
# The demo's speech-to-text model (/v1/audio/*, /v1/realtime), a simulated transcription replica.
DEMO_AUDIO_MODEL = "sim-whisper"


async def _demo(args: argparse.Namespace) -> None:
    # The demo is the one command besides `sim` that runs the simulator.
    from simulator import SimConfig, SimFleet

    sim_cfg = SimConfig(time_scale=args.time_scale)
    # Beside the generative fleet, one embedding model's replica (/v1/embeddings, /pooling).
    embed_cfg = SimConfig(
        model=DEMO_EMBED_MODEL, runner="pooling", time_scale=args.time_scale, kv_events=False
    )
    audio_cfg = SimConfig(
        model=DEMO_AUDIO_MODEL, runner="transcription", time_scale=args.time_scale, kv_events=False
    )
    async with (
        SimFleet(sim_cfg, replicas=args.replicas, host="127.0.0.1", base_port=0) as fleet,
        SimFleet(embed_cfg, replicas=1, host="127.0.0.1", base_port=0) as embed_fleet,
        SimFleet(audio_cfg, replicas=1, host="127.0.0.1", base_port=0) as audio_fleet,
    ):
        # The simulated replicas publish KV events and tokenize with the built-in tokenizer:
        # the demo runs the precise prefix index, as a fleet with vLLM's KV events would.
        cfg = GatewayConfig(
            server=ServerConfig(host=args.host, port=args.port),
            cache_index=CacheIndexConfig(tokenizer="builtin", block_size=sim_cfg.block_size),
            grpc=GrpcConfig(enabled=True, host=args.host, port=args.grpc_port),
            replicas=(
                *(ReplicaConfig(url=r.url, name=r.name, kv_events="auto") for r in fleet.replicas),
                *(ReplicaConfig(url=r.url, name=f"embed-{r.index}") for r in embed_fleet.replicas),
                *(ReplicaConfig(url=r.url, name=f"audio-{r.index}") for r in audio_fleet.replicas),
            ),
        )
        async with _serving(cfg, args.workers, args.log_level) as (url, grpc_port):
            print(f"llm-gateway demo: {url} -> {len(fleet.replicas)} simulated vLLM replicas")
            print(f"  gRPC (llmgateway.v1, reflection on): {args.host}:{grpc_port}")
            for r in fleet.replicas:
                print(f"  {r.name}: {r.url}")
            for r in embed_fleet.replicas:
                print(f"  embed-{r.index} ({DEMO_EMBED_MODEL}, embeddings): {r.url}")
            for r in audio_fleet.replicas:
                print(f"  audio-{r.index} ({DEMO_AUDIO_MODEL}, transcription): {r.url}")
            print("Try:")
            print(
                f"  curl -s {url}/v1/chat/completions -H 'content-type: application/json' "
                f'-d \'{{"model": "{sim_cfg.model}", "messages": '
                f'[{{"role": "user", "content": "Hello!"}}], "max_tokens": 16}}\''
            )
            print("Ctrl-C stops everything.", flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            import signal

            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            print("stopping...", flush=True)


@contextlib.asynccontextmanager
async def _serving(
    cfg: GatewayConfig, workers: int, log_level: str
) -> AsyncIterator[tuple[str, int]]:
    """The demo's gateway, one process or a supervisor's workers: its URL and gRPC port."""
    from gateway.process import running_gateway
    from gateway.supervisor import running_workers, worker_count

    if worker_count(workers) == 1:
        async with running_gateway(cfg, log_level=log_level) as gw:
            yield gw.url, gw.grpc.port if gw.grpc is not None else cfg.grpc.port
            gw.runtime.draining = True
        return
    async with running_workers(cfg, worker_count(workers), log_level) as supervisor:
        yield supervisor.url, supervisor.grpc_port


def _cmd_demo(args: argparse.Namespace) -> int:
    _install_uvloop()
    asyncio.run(_demo(args))
    return 0


# Commands whose arguments and code live in a module of their own, imported only when that
# command is on the command line: `serve` never loads the simulator or the benchmarks.
_LAZY: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("sim",), "simulator.cli", "run a fleet of simulated vLLM replicas"),
    (("agent",), "gateway.agent", "send a replica's GPU figures (NVML) to the gateways"),
    (("bench", "overhead"), "benchmarks.overhead", "the gateway's own cost vs a direct connection"),
    (("bench", "routing"), "benchmarks.routing_bench.cli", "routing quality beside peer routers"),
    (("bench", "routing-cost"), "benchmarks.routing_cost", "CPU cost of one routing decision"),
    (("bench", "replay"), "benchmarks.replay.cli", "closed-loop multi-turn replay per contender"),
    (("bench", "faults"), "benchmarks.faults.cli", "replicas failing, clients misbehaving: lost 0"),
    (("bench", "tenants"), "benchmarks.tenants", "a greedy tenant's effect; P0 under a P2 flood"),
)
# What the `bench` extra installs beyond the gateway's own dependencies.
BENCH_MODULES = ("matplotlib",)
BENCH_INSTALL = "pip install 'llm-gateway[bench]'  (in a checkout: pip install -e '.[bench]')"


class _MissingExtra(Exception):
    """A command needs an optional dependency that is not installed."""


def _require_bench_extra() -> None:
    missing = [m for m in BENCH_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise _MissingExtra(
            f"the benchmarks need the bench extra (missing: {', '.join(missing)}); "
            f"install it with: {BENCH_INSTALL}"
        )


def _lazy_command(module_name: str, bench: bool) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        if bench:
            _require_bench_extra()
        module = importlib.import_module(module_name)
        return int(module.run(args))

    return run


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; a lazy command's own arguments are added only when `argv` names it."""
    parser = argparse.ArgumentParser(
        prog="llm-gateway", description="Cache- and load-aware gateway for vLLM fleets."
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway from a TOML configuration file")
    p.add_argument("-c", "--config", required=True, help="path to the TOML configuration")
    p.add_argument(
        "--workers",
        type=_workers,
        default=None,
        help="gateway processes on the listener, or auto (one per core); default [server] workers",
    )
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("check-config", help="validate a configuration file and exit")
    p.add_argument("config", help="path to the TOML configuration")
    p.set_defaults(func=_cmd_check_config)

    p = sub.add_parser("demo", help="run a simulated vLLM fleet with the gateway in front of it")
    p.add_argument("--host", default="127.0.0.1", help="gateway listen address")
    p.add_argument("--port", type=int, default=8000, help="gateway HTTP port")
    p.add_argument("--replicas", type=int, default=4, help="number of simulated replicas")
    p.add_argument("--time-scale", type=float, default=1.0, help="simulated clock speed-up")
    p.add_argument("--grpc-port", type=int, default=50051, help="gRPC port (0 = any free port)")
    p.add_argument(
        "--workers", type=_workers, default=1, help="gateway processes, or auto (one per core)"
    )
    p.set_defaults(func=_cmd_demo)

    bench = sub.add_parser("bench", help="benchmarks (need the bench extra)")
    groups = {"": sub, "bench": bench.add_subparsers(dest="bench", required=True)}
    words = list(argv)
    for path, module_name, help_text in _LAZY:
        p = groups[" ".join(path[:-1])].add_parser(path[-1], help=help_text)
        is_bench = path[0] == "bench"
        p.set_defaults(func=_lazy_command(module_name, is_bench))
        # Only the command being run gets its arguments (and so its module) loaded.
        if _names(words, path):
            if is_bench:
                # Stop here, not in parse_args: without its module the command's own options
                # are unknown, and argparse would answer "unrecognized arguments" instead.
                _require_bench_extra()
            importlib.import_module(module_name).add_arguments(p)
    return parser


def _names(words: list[str], path: tuple[str, ...]) -> bool:
    """Whether the command line runs the command `path` (its words in order, options aside)."""
    positional: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
        elif w == "--log-level":
            skip = True  # its value is not a command word
        elif not w.startswith("-"):
            positional.append(w)
    return positional[: len(path)] == list(path)


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(words).parse_args(words)
        _setup_logging(args.log_level)
        return int(args.func(args))
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    except _MissingExtra as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
