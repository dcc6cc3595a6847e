"""`--workers N`: N gateway processes on one listener, restarted when they die.

Each worker binds the same host:port with SO_REUSEPORT and the kernel spreads connections
among them (Linux). The supervisor holds each port first, bound with SO_REUSEPORT but never
listening, so no connection lands on it: port 0 becomes one port for every worker, and a
restarted worker gets the same one back. It accepts nothing itself, so a worker's death
costs only that worker's connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gateway.admin import changes
from gateway.admin.changes import Change
from gateway.admin.siblings import change_request, change_wait_s, socket_path, tell
from gateway.config import GatewayConfig
from gateway.http.server import bind
from gateway.workers import READY, WorkerSlot, write_config

log = logging.getLogger("llm_gateway.supervisor")

# A worker that ran this long before dying was not crash-looping: its restart is quick again.
_STABLE_S = 10.0
_FIRST_DELAY_S = 0.1
_MAX_DELAY_S = 5.0
# Beyond drain_timeout_s (when workers cut their last streams) for their front ends to close.
_STOP_MARGIN_S = 10.0
# From spawn to listening: imports, the runtime's first probe and scrape round (each bounded).
_START_TIMEOUT_S = 60.0


class WorkerStartError(RuntimeError):
    """A worker exited (or hung) before it was serving: the gateway does not start."""


def worker_count(configured: int) -> int:
    """Workers to run: `configured`, or one per core for 0."""
    return configured if configured > 0 else os.cpu_count() or 1


def restart_delay(failures: int) -> float:
    """Backoff before restarting a worker that died `failures` times in a row (1 = once)."""
    return min(_MAX_DELAY_S, _FIRST_DELAY_S * 2.0 ** max(0, failures - 1))


def reserve(host: str, port: int) -> socket.socket:
    """Hold host:port for the workers: bound with SO_REUSEPORT, never listening."""
    if not sys.platform.startswith("linux"):
        # Elsewhere SO_REUSEPORT does not spread connections (BSD, macOS: the last one wins).
        raise OSError("several workers need Linux (SO_REUSEPORT); run one per port elsewhere")
    if port:
        # Without SO_REUSEPORT this bind fails on any listener, a stale gateway's included,
        # which would otherwise silently share the port with us.
        bind(host, port).close()
    return bind(host, port, reuse_port=True)


@dataclass
class _Slot:
    """One worker's place: its current process and its record of deaths."""

    index: int
    proc: asyncio.subprocess.Process | None = None
    # Its process said it is listening, and has not exited since.
    serving: bool = False
    started_at: float = 0.0
    restarts: int = 0
    # Deaths in a row, each after less than _STABLE_S of life.
    failures: int = 0


class Supervisor:
    """Starts `workers` processes serving `cfg`, restarts any that dies, drains them on stop."""

    def __init__(
        self, cfg: GatewayConfig, workers: int, log_level: str = "info", config_path: str = ""
    ) -> None:
        self.count = workers
        self._cfg = cfg
        self._log_level = log_level
        self._config_path = config_path
        # SIGHUP's reloads being handed to the workers.
        self._telling: set[asyncio.Task[None]] = set()
        self._slots = [_Slot(i) for i in range(workers)]
        self._held: list[socket.socket] = []
        self._dir = ""
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._killer: asyncio.TimerHandle | None = None
        self.url = ""
        self.http_port = 0
        self.grpc_port = 0

    def pids(self) -> list[int | None]:
        """Each slot's serving process id (None from a death until the restart serves)."""
        return [s.proc.pid if s.serving and s.proc is not None else None for s in self._slots]

    @property
    def restarts(self) -> list[int]:
        """Each slot's restarts so far."""
        return [s.restarts for s in self._slots]

    async def start(self) -> None:
        """Hold the ports, start every worker and return once all serve (WorkerStartError)."""
        self._dir = tempfile.mkdtemp(prefix="llm-gw-")  # 0700: config and private sockets
        try:
            await self._start()
        except BaseException:
            await self._kill_all()
            self._cleanup()
            raise

    async def _start(self) -> None:
        server, grpc = self._cfg.server, self._cfg.grpc
        http_sock = reserve(server.host, server.port)
        self._held.append(http_sock)
        self.http_port = http_sock.getsockname()[1]
        host = f"[{server.host}]" if ":" in server.host else server.host
        self.url = f"http://{host}:{self.http_port}"
        if grpc.enabled:
            grpc_sock = reserve(grpc.host, grpc.port)
            self._held.append(grpc_sock)
            self.grpc_port = grpc_sock.getsockname()[1]
        # As configured: the ports go on the command line, so a reload sees the file's own.
        write_config(self._dir, self._cfg)
        for slot in self._slots:
            await self._spawn(slot)
        ready = await asyncio.gather(*(self._ready(s) for s in self._slots))
        for slot, ok in zip(self._slots, ready, strict=True):
            if not ok:
                assert slot.proc is not None
                raise WorkerStartError(
                    f"worker {slot.index} exited during start-up (status {slot.proc.returncode})"
                )
        self._watchers = [asyncio.create_task(self._watch(s)) for s in self._slots]
        grpc_line = f", gRPC on {grpc.host}:{self.grpc_port}" if grpc.enabled else ""
        log.info("%d workers serving %s%s", self.count, self.url, grpc_line)

    async def _spawn(self, slot: _Slot) -> None:
        worker = WorkerSlot(
            slot.index,
            self.count,
            slot.restarts,
            self._dir,
            self.http_port,
            self.grpc_port,
            self._config_path,
        )
        slot.started_at = time.monotonic()
        slot.proc = await asyncio.create_subprocess_exec(
            *worker.argv(self._log_level),
            # stdin: the worker drains when it closes (this process gone); stdout: its
            # readiness line. A session of its own: a terminal's Ctrl-C reaches only this
            # process, which passes each signal on once (a worker sent SIGINT twice, by the
            # terminal and by us, would stop at once instead of draining).
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        if self._stopping.is_set():  # a stop began while it was being spawned
            slot.proc.send_signal(signal.SIGTERM)

    async def _ready(self, slot: _Slot) -> bool:
        """Whether the slot's process reports it is serving (False: it exited first)."""
        proc = slot.proc
        assert proc is not None and proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), _START_TIMEOUT_S)
        except TimeoutError:
            log.error(
                "worker %d (pid %d) not serving after %.0f s",
                slot.index,
                proc.pid,
                _START_TIMEOUT_S,
            )
            proc.kill()
            line = b""
        if line != READY:
            await proc.wait()
            return False
        log.info("worker %d serving (pid %d)", slot.index, proc.pid)
        slot.serving = True
        return True

    async def _watch(self, slot: _Slot) -> None:
        """Restart the slot's process whenever it exits, until the supervisor stops."""
        while True:
            assert slot.proc is not None
            status = await slot.proc.wait()
            slot.serving = False
            if self._stopping.is_set():
                return
            lived = time.monotonic() - slot.started_at
            slot.failures = 1 if lived >= _STABLE_S else slot.failures + 1
            slot.restarts += 1
            delay = restart_delay(slot.failures)
            log.warning(
                "worker %d (pid %d) exited with status %s after %.1f s; restart %d in %.1f s",
                slot.index,
                slot.proc.pid,
                status,
                lived,
                slot.restarts,
                delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if self._stopping.is_set():
                return
            try:
                await self._spawn(slot)
            except OSError:
                log.exception("worker %d could not be started", slot.index)
                continue  # the dead process's status returns at once: the next backoff
            # It replays the journal (admin changes, reloads) before it reports ready.
            await self._ready(slot)

    def forward(self, sig: int) -> None:
        """Pass `sig` to every worker; the first one stops the supervisor (drain, then exit)."""
        if not self._stopping.is_set():
            self._stopping.set()
            grace = self._cfg.server.drain_timeout_s + _STOP_MARGIN_S
            loop = asyncio.get_running_loop()
            self._killer = loop.call_later(grace, self._kill)
            log.info("stopping %d workers: streams get %.0f s", self.count, grace - _STOP_MARGIN_S)
        for slot in self._slots:
            if slot.proc is not None and slot.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(sig)

    def reload(self) -> None:
        """SIGHUP: every worker re-reads the configuration file, and so will one started later."""
        change = Change("reload")
        # Journaled before any worker is told: one (re)starting meanwhile replays it. A line
        # appended to our private directory: this loop serves no client.
        offset = changes.append(self._dir, change)
        task = asyncio.get_running_loop().create_task(self._tell(offset, change))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)
        log.info("SIGHUP passed on to the workers: each reloads %s", self._config_path or "-")

    async def _tell(self, offset: int, change: Change) -> None:
        """Hand journaled `change` to every worker over its private socket; log refusals."""
        request = change_request(offset, change)
        wait_s = change_wait_s(self._cfg)
        paths = [socket_path(self._dir, s.index) for s in self._slots]
        answers = await asyncio.gather(*(tell(p, request, wait_s) for p in paths))
        for slot, answer in zip(self._slots, answers, strict=True):
            if answer != "ok":
                log.warning("worker %d: %s: %s", slot.index, change.op, answer)

    async def wait(self) -> None:
        """Until every worker has exited after a stop; then release the ports."""
        try:
            await asyncio.gather(*self._watchers)
        finally:
            if self._killer is not None:
                self._killer.cancel()
            self._cleanup()

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        """Drain every worker (SIGKILL past drain_timeout_s and a margin) and release all."""
        self.forward(sig)
        await self.wait()

    def _kill(self) -> list[asyncio.subprocess.Process]:
        """SIGKILL every worker still running; the ones killed."""
        procs = [s.proc for s in self._slots if s.proc is not None and s.proc.returncode is None]
        if procs:
            log.warning("killing %d workers still running", len(procs))
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        return procs

    async def _kill_all(self) -> None:
        await asyncio.gather(*(p.wait() for p in self._kill()))

    def _cleanup(self) -> None:
        for sock in self._held:
            sock.close()
        self._held.clear()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


@contextlib.asynccontextmanager
async def running_workers(
    cfg: GatewayConfig, workers: int, log_level: str = "warning", config_path: str = ""
) -> AsyncIterator[Supervisor]:
    """A supervisor and its serving workers for the duration of the block (tests, demo)."""
    supervisor = Supervisor(cfg, workers, log_level, config_path)
    await supervisor.start()
    try:
        yield supervisor
    finally:
        await supervisor.stop()


async def supervise(cfg: GatewayConfig, workers: int, log_level: str, config_path: str) -> int:
    """`serve --workers N`: run until SIGINT/SIGTERM, drain every worker, exit 0."""
    supervisor = Supervisor(cfg, workers, log_level, config_path)
    await supervisor.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, supervisor.forward, sig)
    loop.add_signal_handler(signal.SIGHUP, supervisor.reload)
    await supervisor.wait()
    return 0
