"""The `llm-gateway` command: serve, demo, check-config, sim, bench."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from gateway.config import (
    CacheIndexConfig,
    GatewayConfig,
    ReplicaConfig,
    ServerConfig,
    load_config,
)
from gateway.config_loader import ConfigError
from gateway.grpc_config import GrpcConfig


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _cmd_serve(args: argparse.Namespace) -> int:
    from gateway.runtime import build_router
    from gateway.server import serve

    cfg = load_config(args.config)
    build_router(cfg)  # plugin errors surface before any socket opens
    _install_uvloop()
    asyncio.run(serve(cfg, args.log_level))
    return 0


def _cmd_check_config(args: argparse.Namespace) -> int:
    from gateway.runtime import build_router

    cfg = load_config(args.config)
    router = build_router(cfg)
    print(
        f"{args.config}: OK ({len(cfg.replicas)} replicas, routing profile {router.profile_name!r})"
    )
    return 0


async def _demo(args: argparse.Namespace) -> None:
    from benchmarks.sim import SimConfig, SimFleet
    from gateway.server import running_gateway

    sim_cfg = SimConfig(time_scale=args.time_scale)
    async with SimFleet(sim_cfg, replicas=args.replicas, host="127.0.0.1", base_port=0) as fleet:
        # The simulated replicas publish KV events and tokenize with the built-in tokenizer:
        # the demo runs the precise prefix index, as a fleet with vLLM's KV events would.
        cfg = GatewayConfig(
            server=ServerConfig(host=args.host, port=args.port),
            cache_index=CacheIndexConfig(tokenizer="builtin", block_size=sim_cfg.block_size),
            grpc=GrpcConfig(enabled=True, host=args.host, port=args.grpc_port),
            replicas=tuple(
                ReplicaConfig(url=r.url, name=r.name, kv_events="auto") for r in fleet.replicas
            ),
        )
        async with running_gateway(cfg, log_level=args.log_level) as gw:
            print(f"llm-gateway demo: {gw.url} -> {len(fleet.replicas)} simulated vLLM replicas")
            print(f"  gRPC (llmgateway.v1, reflection on): {args.host}:{args.grpc_port}")
            for r in fleet.replicas:
                print(f"  {r.name}: {r.url}")
            print("Try:")
            print(
                f"  curl -s {gw.url}/v1/chat/completions -H 'content-type: application/json' "
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
            gw.runtime.draining = True
            print("stopping...", flush=True)


def _cmd_demo(args: argparse.Namespace) -> int:
    _install_uvloop()
    asyncio.run(_demo(args))
    return 0


def _cmd_sim(args: argparse.Namespace) -> int:
    from benchmarks.sim import cli as sim_cli

    return sim_cli.run(args)


def _cmd_bench_overhead(args: argparse.Namespace) -> int:
    from benchmarks import overhead

    return overhead.run(args)


def _cmd_bench_routing_cost(args: argparse.Namespace) -> int:
    from benchmarks import routing_cost

    return routing_cost.run(args)


def _cmd_bench_routing(args: argparse.Namespace) -> int:
    from benchmarks.routing_bench import cli as routing_bench_cli

    return routing_bench_cli.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-gateway", description="Cache- and load-aware gateway for vLLM fleets."
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway from a TOML configuration file")
    p.add_argument("-c", "--config", required=True, help="path to the TOML configuration")
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
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("sim", help="run a fleet of simulated vLLM replicas")
    from benchmarks.sim import cli as sim_cli

    sim_cli.add_arguments(p)
    p.set_defaults(func=_cmd_sim)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    p = bench.add_parser("overhead", help="the gateway's own cost vs a direct connection")
    from benchmarks import overhead

    overhead.add_arguments(p)
    p.set_defaults(func=_cmd_bench_overhead)
    p = bench.add_parser("routing", help="routing quality side by side with peer routers")
    from benchmarks.routing_bench import cli as routing_bench_cli

    routing_bench_cli.add_arguments(p)
    p.set_defaults(func=_cmd_bench_routing)
    p = bench.add_parser("routing-cost", help="CPU cost of one routing decision (16 replicas)")
    from benchmarks import routing_cost

    routing_cost.add_arguments(p)
    p.set_defaults(func=_cmd_bench_routing_cost)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
