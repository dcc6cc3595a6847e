"""One of `--workers` gateway processes: the single process's gateway on a shared port.

Each worker is started by the supervisor (gateway/supervisor.py) as `python -m gateway.workers`
and runs everything one process runs today: runtime, score loop, KV-event subscription, HTTP
and gRPC front ends. Beside them it listens on a private unix socket (in the supervisor's 0700
directory) through which its siblings read its metrics and fleet view and hand it heartbeats and
admin changes: any worker's `/metrics` and `GET /admin/replicas` then describe the whole
gateway, and a heartbeat or an admin change (gateway/admin/changes.py) reaches every worker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import pickle
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.admin import changes
from gateway.admin.reload import install_sighup
from gateway.admin.siblings import Siblings, socket_path
from gateway.admin.views import merge_views
from gateway.config import GatewayConfig
from gateway.http.server import HttpServer, bind
from gateway.logs import setup_logging
from gateway.process import started
from gateway.runtime import Runtime
from telemetry.metrics import CONTENT_TYPE, merge_snapshots

log = logging.getLogger("llm_gateway.workers")

READY = b"ready\n"


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """Where a worker stands among its siblings, as the supervisor passes it on the command line."""

    index: int
    count: int
    # Times this slot's process died and was restarted (reported as a counter).
    restarts: int
    # The supervisor's private directory: the config and every worker's socket.
    channel_dir: str
    # The ports the supervisor holds (the config may say 0); gRPC's 0 when it is off.
    http_port: int
    grpc_port: int = 0
    # The TOML file a SIGHUP re-reads ("" = none: the demo's, a test's).
    config_path: str = ""

    def socket_path(self, index: int) -> str:
        return socket_path(self.channel_dir, index)

    def argv(self, log_level: str) -> list[str]:
        """The command line that starts this worker."""
        return [
            *(sys.executable, "-m", "gateway.workers", self.channel_dir),
            *("--index", str(self.index), "--count", str(self.count)),
            *("--restarts", str(self.restarts), "--http-port", str(self.http_port)),
            *("--grpc-port", str(self.grpc_port), "--config-path", self.config_path),
            *("--log-level", log_level),
        ]


def write_config(channel_dir: str, cfg: GatewayConfig) -> None:
    """The config every worker of `channel_dir` starts from."""
    with open(os.path.join(channel_dir, "config.pickle"), "wb") as f:
        pickle.dump(cfg, f)


def read_config(channel_dir: str) -> GatewayConfig:
    # Written by our own supervisor, in its 0700 directory: trusted as our own code.
    with open(os.path.join(channel_dir, "config.pickle"), "rb") as f:
        cfg = pickle.load(f)
    assert isinstance(cfg, GatewayConfig)
    return cfg


@dataclass
class _Reply:
    """An ASGI response held back: the inner app's answer, sent (or replaced) afterwards."""

    messages: list[Message] = field(default_factory=list)

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"]) if self.messages else 500

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])

    async def send_to(self, send: Send) -> None:
        for message in self.messages:
            await send(message)


class SiblingsApp:
    """The app in front of a worker's GatewayApp: /metrics, the fleet view and heartbeats span
    every worker (admin changes are spread by the admin routes themselves, Fleet.spread).

    The inner app still answers these routes first, so keys, limits and validation are its own;
    only an accepted answer is widened. Every other request goes straight through.
    """

    def __init__(self, app: ASGIApp, siblings: Siblings) -> None:
        self.app = app
        self.siblings = siblings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path == "/metrics" and scope["method"] == "GET":
                return await self._metrics(scope, receive, send)
            if path == "/admin/heartbeat" and scope["method"] == "POST":
                return await self._heartbeat(scope, receive, send)
            if path == "/admin/replicas" and scope["method"] == "GET":
                return await self._replicas(scope, receive, send)
        await self.app(scope, receive, send)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        reply = _Reply()
        await self.app(scope, receive, reply)
        if reply.status != 200:
            return await reply.send_to(send)
        own = (self.siblings.slot.index, self.siblings.runtime.metrics.snapshot())
        body = merge_snapshots([own, *await self.siblings.snapshots()])
        await _send(send, body, CONTENT_TYPE)

    async def _replicas(self, scope: Scope, receive: Receive, send: Send) -> None:
        reply = _Reply()
        await self.app(scope, receive, reply)
        if reply.status != 200:
            return await reply.send_to(send)
        own = orjson.loads(reply.body)
        views = await self.siblings.views()
        merged = merge_views([(self.siblings.slot.index, own["replicas"]), *views])
        body = {**own, "replicas": merged, "workers_reporting": 1 + len(views)}
        await _send(send, orjson.dumps(body), "application/json")

    async def _heartbeat(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []

        async def tee() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
            return message

        reply = _Reply()
        await self.app(scope, tee, reply)
        if reply.status == 204:  # applied here: valid, and within the limits
            await self.siblings.heartbeat(b"".join(chunks))
        await reply.send_to(send)


async def _send(send: Send, body: bytes, content_type: str) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def serve_worker(
    cfg: GatewayConfig, slot: WorkerSlot, log_level: str, on_started: Callable[[], None]
) -> None:
    """Serve as worker `slot` until SIGINT/SIGTERM or the supervisor's end, then drain."""
    runtime = Runtime(cfg, worker_index=slot.index, worker_count=slot.count)
    runtime.config_path = slot.config_path or None
    runtime.metrics.track_worker(os.getpid(), slot.restarts)
    siblings = Siblings(slot, runtime)
    sock = bind(cfg.server.host, slot.http_port, reuse_port=True)
    orphaned = asyncio.Event()
    try:
        await siblings.start()
        async with started(runtime, slot.grpc_port if cfg.grpc.enabled else None):
            install_sighup(runtime)  # a SIGHUP sent to this worker itself
            # Before it serves: a restarted worker catches up on every change since the start.
            runtime.fleet.spread = siblings.spread
            await siblings.replay()
            server = HttpServer(
                runtime,
                log_level,
                wrap=lambda app: SiblingsApp(app, siblings),
                on_started=on_started,
            )
            _stop_with_supervisor(server, orphaned)
            await server.serve(sockets=[sock])
    finally:
        await siblings.close()
        sock.close()
        if orphaned.is_set():
            _remove_channel(slot.channel_dir)


def _remove_channel(channel_dir: str) -> None:
    """A dead supervisor cannot remove its directory: its last worker out does."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(channel_dir, "config.pickle"))
    changes.remove_journal(channel_dir)
    with contextlib.suppress(OSError):  # not empty: a sibling is still on its way out
        os.rmdir(channel_dir)


def _stop_with_supervisor(server: HttpServer, orphaned: asyncio.Event) -> None:
    """Drain once stdin, the supervisor's end of a pipe, closes: no worker outlives it."""
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            return
        if not data:
            loop.remove_reader(fd)
            log.warning("the supervisor is gone: draining")
            orphaned.set()
            server.handle_exit(signal.SIGTERM, None)

    loop.add_reader(fd, readable)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.workers")
    parser.add_argument("channel_dir")
    for name in ("--index", "--count", "--restarts", "--http-port", "--grpc-port"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--config-path", default="")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    slot = WorkerSlot(
        args.index,
        args.count,
        args.restarts,
        args.channel_dir,
        args.http_port,
        args.grpc_port,
        args.config_path,
    )
    cfg = read_config(slot.channel_dir)
    setup_logging(
        args.log_level,
        cfg.telemetry.log_format,
        f"%(asctime)s %(levelname)s worker {slot.index} %(name)s: %(message)s",
        {"worker": slot.index},
    )
    # stdout is the readiness pipe to the supervisor and nothing else: stray output goes to
    # stderr, where it cannot be mistaken for (or block) the one line the supervisor reads.
    ready_pipe = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    def ready() -> None:
        ready_pipe.write(READY)

    with ready_pipe:
        asyncio.run(serve_worker(cfg, slot, args.log_level, ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
