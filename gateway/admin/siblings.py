"""The private channel of `--workers`: each worker's unix socket, and the client side of it.

Every worker listens in the supervisor's 0700 directory; its siblings read its metric snapshot
and fleet view there, and hand it heartbeats and admin changes (gateway/admin/changes.py); the
supervisor hands it SIGHUP's reload the same way. One request per connection: a line naming it,
a body when it has one, then the answer up to the close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any

import orjson

from gateway.admin import changes
from gateway.admin.changes import Change
from gateway.admin.views import fleet_view
from gateway.config import GatewayConfig
from gateway.errors import GatewayError
from gateway.replicas.gpu import apply_heartbeat

if TYPE_CHECKING:
    from gateway.runtime import Runtime
    from gateway.workers import WorkerSlot

log = logging.getLogger("llm_gateway.workers")

# A sibling answers from memory in microseconds; one that takes this long is restarting or
# stuck, and the scrape (or heartbeat) goes on without it.
SIBLING_TIMEOUT_S = 1.0
# A heartbeat is a few numbers (the HTTP route refuses bodies over 64 KiB before this).
_MAX_HEARTBEAT_BYTES = 65536
# An admin change carries at most a replica's table (its route's body limit, with room).
_MAX_CHANGE_BYTES = 262144
# Beyond drain_timeout_s (a removal's longest wait) for a sibling to apply a change.
_CHANGE_MARGIN_S = 10.0
# A starting worker applies changes once it has replayed the journal: after its first probes.
_REPLAY_WAIT_S = 60.0


def socket_path(channel_dir: str, index: int) -> str:
    """Where worker `index` of `channel_dir` listens for its siblings (and the supervisor)."""
    return os.path.join(channel_dir, f"worker-{index}.sock")


def change_request(offset: int, change: Change) -> bytes:
    """The private socket's message handing journaled change `offset` to a worker."""
    body = change.encode()
    return b"change %d %d\n" % (offset, len(body)) + body


def change_wait_s(cfg: GatewayConfig) -> float:
    """How long a worker may take to apply a change: a removal drains first."""
    return cfg.server.drain_timeout_s + _CHANGE_MARGIN_S


async def ask(path: str, request: bytes, wait_s: float) -> bytes:
    """Send `request` to the worker socket at `path`; its whole answer (OSError, TimeoutError)."""
    async with asyncio.timeout(wait_s):
        reader, writer = await asyncio.open_unix_connection(path)
        try:
            writer.write(request)
            await writer.drain()
            return await reader.read()
        finally:
            writer.close()


async def tell(path: str, request: bytes, wait_s: float) -> str:
    """Hand a change to the worker at `path`: its "ok" or "error: ...", never an exception."""
    try:
        answer = await ask(path, request, wait_s)
    except TimeoutError:
        return f"error: no answer within {wait_s:.0f} s (it may still be applying it)"
    except OSError as exc:
        # The journal has it (written before any worker is told): a (re)start replays it.
        return f"error: unreachable ({exc.strerror or exc}); it applies the change when it starts"
    return answer.decode(errors="replace") or "error: no answer (it was stopping or restarting)"


class Siblings:
    """This worker's private socket, and the client side of its siblings' ones."""

    def __init__(self, slot: WorkerSlot, runtime: Runtime) -> None:
        self.slot = slot
        self.runtime = runtime
        self._server: asyncio.AbstractServer | None = None
        # Journal offsets of the admin changes applied here, with their outcome.
        self._applied: dict[int, str] = {}
        self._replayed = asyncio.Event()

    async def start(self) -> None:
        path = self.slot.socket_path(self.slot.index)
        # A predecessor killed in this slot left its socket file behind.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._server = await asyncio.start_unix_server(self._handle, path=path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.slot.socket_path(self.slot.index))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(SIBLING_TIMEOUT_S):
                verb, _, arg = (await reader.readline()).decode().strip().partition(" ")
                if verb != "change":
                    writer.write(await self._quick(verb, arg, reader))
                    await writer.drain()
                    return
                offset, size = map(int, arg.split())
                if not 0 < size <= _MAX_CHANGE_BYTES:
                    raise ValueError(f"an admin change of {size} bytes")
                change = Change.decode(await reader.readexactly(size))
            # Not under the short deadline: a removal drains, a reload may remove several.
            writer.write((await self.apply(offset, change)).encode())
            async with asyncio.timeout(SIBLING_TIMEOUT_S):
                await writer.drain()
        except (
            OSError,
            TimeoutError,
            ValueError,
            TypeError,
            GatewayError,
            asyncio.IncompleteReadError,
        ):
            log.warning("a sibling's request failed", exc_info=True)
        finally:
            writer.close()

    async def _quick(self, verb: str, arg: str, reader: asyncio.StreamReader) -> bytes:
        """The answer to a request served from memory (b"" for one not understood)."""
        runtime = self.runtime
        if verb == "metrics":
            return runtime.metrics.snapshot()
        if verb == "replicas":
            return orjson.dumps(fleet_view(runtime.pool, runtime.fleet.origins))
        if verb == "heartbeat" and 0 < int(arg) <= _MAX_HEARTBEAT_BYTES:
            body = await reader.readexactly(int(arg))
            apply_heartbeat(runtime.pool, orjson.loads(body))
            return b"ok"
        return b""

    async def apply(self, offset: int, change: Change) -> str:
        """Apply journaled change `offset` once (after the replay): "ok" or "error: ..."."""
        try:
            await asyncio.wait_for(self._replayed.wait(), _REPLAY_WAIT_S)
        except TimeoutError:
            return "error: still starting"
        if offset not in self._applied:  # else the replay applied it already
            self._applied[offset] = "applying"
            self._applied[offset] = await changes.apply(self.runtime, change)
        return self._applied[offset]

    async def replay(self) -> None:
        """Apply every journaled change, oldest first: a (re)started worker catches up."""
        try:
            entries = await asyncio.to_thread(changes.read, self.slot.channel_dir)
            for offset, change in entries:
                if offset not in self._applied:
                    self._applied[offset] = outcome = await changes.apply(self.runtime, change)
                    if outcome != "ok":
                        log.warning("replayed admin change %s: %s", change.op, outcome)
            if entries:
                log.info("replayed %d admin changes from the journal", len(entries))
        finally:
            self._replayed.set()

    async def spread(self, change: Change) -> dict[str, str]:
        """Journal a change applied here, hand it to every sibling: each worker's outcome."""
        offset = await asyncio.to_thread(changes.append, self.slot.channel_dir, change)
        self._applied[offset] = "ok"
        request = change_request(offset, change)
        wait_s = change_wait_s(self.runtime.config)
        others = self._others()
        answers = await asyncio.gather(
            *(tell(self.slot.socket_path(i), request, wait_s) for i in others)
        )
        outcomes = {str(self.slot.index): "ok"}
        for i, answer in zip(others, answers, strict=True):
            outcomes[str(i)] = answer
            if answer != "ok":
                log.warning("admin change %s on worker %d: %s", change.op, i, answer)
        return outcomes

    async def _ask(self, index: int, request: bytes) -> bytes | None:
        try:
            return await ask(self.slot.socket_path(index), request, SIBLING_TIMEOUT_S)
        except (OSError, TimeoutError):
            return None  # not started yet, restarting, or stuck: the others still answer

    def _others(self) -> list[int]:
        return [i for i in range(self.slot.count) if i != self.slot.index]

    async def snapshots(self) -> list[tuple[int, bytes]]:
        """The siblings' metric snapshots, those that answered in time."""
        others = self._others()
        answers = await asyncio.gather(*(self._ask(i, b"metrics\n") for i in others))
        return [(i, a) for i, a in zip(others, answers, strict=True) if a]

    async def views(self) -> list[tuple[int, list[dict[str, Any]]]]:
        """The siblings' GET /admin/replicas rows, those that answered in time."""
        others = self._others()
        answers = await asyncio.gather(*(self._ask(i, b"replicas\n") for i in others))
        return [(i, orjson.loads(a)) for i, a in zip(others, answers, strict=True) if a]

    async def heartbeat(self, body: bytes) -> int:
        """Hand an accepted heartbeat to every sibling; how many took it."""
        request = b"heartbeat %d\n" % len(body) + body
        answers = await asyncio.gather(*(self._ask(i, request) for i in self._others()))
        return sum(a == b"ok" for a in answers)
