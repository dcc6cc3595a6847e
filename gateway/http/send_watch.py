"""The send timeout both front-end protocols share: a client that reads nothing is cut."""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from typing import ClassVar

log = logging.getLogger("llm_gateway.http")


class SendWatch(asyncio.BaseProtocol):
    """Mixed in before a uvicorn protocol: while the transport's buffer is full (writing
    paused), a client that drains nothing of it for `send_timeout_s` has its connection
    aborted. A close would wait for the buffer to flush, which it never will; the abort is a
    disconnect to the app, which cancels the upstream request and frees its slot."""

    send_timeout_s: ClassVar[float] = 60.0
    # Names the connection kind in the log line.
    watched_kind: ClassVar[str] = "client"
    loop: asyncio.AbstractEventLoop
    client: tuple[str, int] | None
    _send_timer: asyncio.TimerHandle | None = None
    _send_mark: int = 0

    @abstractmethod
    def _watched(self) -> asyncio.WriteTransport | None:
        """The socket's own transport (None once it is gone)."""

    def pause_writing(self) -> None:
        super().pause_writing()
        raw = self._watched()
        if self._send_timer is None and raw is not None:
            self._send_mark = raw.get_write_buffer_size()
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._send_check)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_send_watch()

    def _stop_send_watch(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_check(self) -> None:
        self._send_timer = None
        raw = self._watched()
        if raw is None:
            return
        left = raw.get_write_buffer_size()
        if not left:
            return
        if left < self._send_mark:  # it read something: progress, another period
            self._send_mark = left
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._send_check)
            return
        log.warning(
            "%s %s read nothing for %g s: connection closed",
            self.watched_kind,
            self.client[0] if self.client else "?",
            self.send_timeout_s,
        )
        raw.abort()
