"""Streaming load for fleet-change tests: every stream must end with [DONE], counts must match."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from types import TracebackType

import httpx

from tests.gateway.conftest import MODEL


@dataclass
class StreamingLoad:
    """`clients` concurrent clients, each sending streams back to back until the block ends."""

    url: str
    clients: int = 8
    max_tokens: int = 60
    headers: dict[str, str] = field(default_factory=dict)
    sent: int = 0
    completed: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def body(self) -> dict[str, object]:
        # A different prompt each time: no cache affinity, the router spreads them.
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"story number {next(self._ids)}"}],
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
        }

    async def _client(self, c: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            self.sent += 1
            try:
                async with c.stream("POST", "/v1/chat/completions", json=self.body()) as r:
                    raw = b"".join([x async for x in r.aiter_raw()])
            except httpx.HTTPError as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            if r.status_code == 200 and raw.endswith(b"data: [DONE]\n\n"):
                self.completed += 1
            else:
                self.failures.append(f"{r.status_code}: {raw[-200:]!r}")

    async def wait_for(self, completed: int, timeout: float = 20.0) -> None:  # noqa: ASYNC109
        """Until `completed` more streams have completed than now (a deadline, not a sleep)."""
        target = self.completed + completed
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.completed < target:
            assert not self.failures, self.failures[:3]
            assert loop.time() < deadline, f"only {self.completed} of {target} streams completed"
            await asyncio.sleep(0.01)

    async def __aenter__(self) -> StreamingLoad:
        self._client_ctx = httpx.AsyncClient(base_url=self.url, timeout=30.0, headers=self.headers)
        c = await self._client_ctx.__aenter__()
        self._tasks = [asyncio.create_task(self._client(c)) for _ in range(self.clients)]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.gather(*self._tasks), timeout=30.0)
        finally:
            await self._client_ctx.__aexit__(exc_type, exc, tb)

    def check(self) -> None:
        """No stream dropped: every request sent completed with [DONE]."""
        assert not self.failures, self.failures[:5]
        assert self.sent == self.completed > 0
