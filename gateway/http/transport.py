"""The front end's per-connection pieces: the app's disconnect hook and the wrapped transport."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterable
from typing import Protocol

# The transport methods uvicorn calls, bound straight to the real transport: no extra call.
_FORWARDED = (
    "can_write_eof", "abort", "get_extra_info",
    "get_write_buffer_size", "get_write_buffer_limits", "set_write_buffer_limits",
    "pause_reading", "resume_reading", "is_reading", "set_protocol", "get_protocol",
)  # fmt: skip


# The scope extension under which the protocol offers the app its disconnect hook.
DISCONNECT_EXTENSION = "llm_gateway.disconnect"


class _Body(Protocol):
    # uvicorn's RequestResponseCycle: False once the whole body is buffered.
    more_body: bool


class DisconnectHook:
    """Set `callback` to be called once if the client goes before its response completes."""

    __slots__ = ("_cycle", "callback")

    def __init__(self) -> None:
        # Called from the protocol's callbacks: it must only flag and cancel, never await.
        self.callback: Callable[[], None] | None = None
        self._cycle: weakref.ref[_Body] | None = None

    def attach(self, cycle: _Body) -> None:
        """The request's cycle, whose body state `body_buffered` reports."""
        # Weakly: the cycle's scope holds this hook, and a strong reference back made every
        # request a reference cycle (~11 objects) that only the cyclic collector could free:
        # 17,647 cycles in 3 s at c=16, the young collections' whole load.
        self._cycle = weakref.ref(cycle)

    @property
    def body_buffered(self) -> bool:
        """The whole request body has arrived: the next receive() returns it at once."""
        cycle = self._cycle() if self._cycle is not None else None
        return cycle is not None and not cycle.more_body

    def fire(self) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


class _Closer(Protocol):
    """The connection's protocol: it decides how a close happens."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def close_requested(self) -> None: ...


class LingeringTransport(asyncio.Transport):
    """The connection's transport, but a close is the protocol's to decide (it may linger)."""

    def __init__(self, raw: asyncio.Transport, protocol: _Closer) -> None:
        super().__init__()
        self.raw = raw
        self._protocol = protocol
        self._closing = False
        self._raw_write = raw.write
        self._raw_writelines = raw.writelines
        # A response head waiting for its body's first bytes: one send for both, not two
        # (on loopback each send also runs the receiver's TCP processing inline).
        self._held: bytes | None = None
        self._loop = protocol.loop
        for name in _FORWARDED:
            setattr(self, name, getattr(raw, name))

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._raw_writelines((held, data))
        elif data[:9] == b"HTTP/1.1 ":
            # uvicorn writes a head on its own (http.response.start); the body follows
            # within this callback, or the flush scheduled here sends the head alone.
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._raw_write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.flush()
        self._raw_writelines(list_of_data)

    def write_eof(self) -> None:
        self.flush()
        self.raw.write_eof()

    def flush(self) -> None:
        """Send a held response head now."""
        held = self._held
        if held is not None:
            self._held = None
            self._raw_write(held)

    def is_closing(self) -> bool:
        return self._closing or self.raw.is_closing()

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._protocol.close_requested()
