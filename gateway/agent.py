"""`llm-gateway agent`: beside a vLLM replica, read its GPUs with NVML and heartbeat the gateways.

The gateway's own NVML reader only sees GPUs on its host; a gateway in front of replicas on
other hosts learns their GPU memory and utilisation from this agent, one per replica, which
posts `POST /admin/heartbeat` to every gateway it is told of, with an admin key.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from gateway.replicas.gpu import NvmlUnavailable, open_nvml, read_nvml

log = logging.getLogger("llm_gateway.agent")

# The admin key is read from the environment, never from the command line (`ps` shows that).
KEY_ENV = "LLM_GATEWAY_ADMIN_KEY"


class AgentError(Exception):
    """No GPU reader here, or bad settings."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading over the replica's GPUs: bytes used and total, utilisation in [0, 1]."""

    used_bytes: int
    total_bytes: int
    utilization: float


class GpuReader(Protocol):
    """Where the samples come from: NVML on a GPU host."""

    def read(self, indices: tuple[int, ...]) -> GpuSample:
        """A fresh sample over the given device indices (blocking: run it in a thread)."""
        ...


class NvmlReader:
    """NVML through nvidia-ml-py; AgentError when no driver or library is present."""

    def __init__(self) -> None:
        try:
            self._nvml = open_nvml()
        except NvmlUnavailable as exc:
            raise AgentError(f"NVML unavailable: {exc}") from None

    def read(self, indices: tuple[int, ...]) -> GpuSample:
        return GpuSample(*read_nvml(self._nvml, indices))


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """What one agent reports, to whom and how often."""

    gateways: tuple[str, ...]
    replica: str
    gpu_indices: tuple[int, ...] = (0,)
    interval_s: float = 1.0
    timeout_s: float = 2.0
    admin_key: str = ""
    # The replica itself, probed (GET /health) for the liveness every heartbeat carries.
    vllm_url: str = "http://127.0.0.1:8000"

    def __post_init__(self) -> None:
        if not self.gateways:
            raise AgentError("at least one --gateway URL is needed")
        if not self.replica:
            raise AgentError("--replica must name the replica as the gateways' TOML does")
        if not self.gpu_indices or any(i < 0 for i in self.gpu_indices):
            raise AgentError("--gpus must list device indices >= 0")
        if self.interval_s <= 0 or self.timeout_s <= 0:
            raise AgentError("--interval-s and --timeout-s must be > 0")


class Agent:
    """Reads a sample, posts it to every gateway at once; a failing gateway never stops it.

    `reader` None: no GPU can be read here (said once at start); heartbeats carry the
    replica's liveness alone.
    """

    def __init__(
        self, settings: AgentSettings, reader: GpuReader | None, session: aiohttp.ClientSession
    ) -> None:
        self.settings = settings
        self._reader = reader
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=settings.timeout_s)
        self._headers = (
            {"authorization": f"Bearer {settings.admin_key}"} if settings.admin_key else {}
        )
        # The last outcome per gateway (HTTP status, or 0 when it could not be reached), so a
        # failure is logged when it starts and when it ends, not once a second.
        self.last_status: dict[str, int] = {}
        self.sent = 0

    def payload(self, sample: GpuSample | None, vllm_healthy: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"replica": self.settings.replica, "vllm_healthy": vllm_healthy}
        if sample is not None:
            body["gpu_memory_used_bytes"] = sample.used_bytes
            body["gpu_memory_total_bytes"] = sample.total_bytes
            body["gpu_utilization"] = min(1.0, max(0.0, sample.utilization))
        return body

    async def vllm_healthy(self) -> bool:
        """Whether the replica answers its /health with 200 within the timeout."""
        url = self.settings.vllm_url.rstrip("/") + "/health"
        try:
            async with self._session.get(url, timeout=self._timeout) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, ConnectionError, TimeoutError):
            return False

    async def _post(self, gateway: str, body: dict[str, Any]) -> None:
        url = gateway.rstrip("/") + "/admin/heartbeat"
        try:
            async with self._session.post(
                url, json=body, headers=self._headers, timeout=self._timeout
            ) as resp:
                status = resp.status
                detail = "" if status == 204 else (await resp.text())[:200]
        except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
            status, detail = 0, f"{type(exc).__name__}: {exc}"
        before = self.last_status.get(gateway)
        self.last_status[gateway] = status
        if status == 204:
            self.sent += 1
            if before not in (None, 204):
                log.info("heartbeats to %s accepted again", gateway)
        elif before in (None, 204):
            log.warning(
                "heartbeat to %s refused (%s): %s", gateway, status or "unreachable", detail
            )

    async def beat(self) -> None:
        """One sample to every gateway."""
        reader = self._reader
        sample = None
        if reader is not None:
            sample = await asyncio.to_thread(reader.read, self.settings.gpu_indices)
        body = self.payload(sample, await self.vllm_healthy())
        await asyncio.gather(*(self._post(g, body) for g in self.settings.gateways))

    async def run(self) -> None:
        """Beat every `interval_s`, forever (cancelled by the owner); a read error is logged."""
        while True:
            started = time.monotonic()
            try:
                await self.beat()
            except Exception as exc:  # a device vanished: say so, try again next beat
                log.warning("GPU read failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(max(0.0, self.settings.interval_s - (time.monotonic() - started)))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gateway", action="append", required=True, help="a gateway URL (repeat)")
    p.add_argument("--replica", required=True, help="this replica's name in the gateways' TOML")
    p.add_argument("--gpus", default="0", help="comma-separated device indices (default 0)")
    p.add_argument("--interval-s", type=float, default=1.0, help="seconds between heartbeats")
    p.add_argument("--timeout-s", type=float, default=2.0, help="timeout of each post")
    p.add_argument(
        "--vllm-url",
        default="http://127.0.0.1:8000",
        help="this replica's own URL, probed for the liveness each heartbeat carries",
    )


def settings_from(args: argparse.Namespace, environ: dict[str, str] | None = None) -> AgentSettings:
    env = os.environ if environ is None else environ
    try:
        gpus = tuple(int(x) for x in str(args.gpus).split(",") if x.strip())
    except ValueError:
        raise AgentError(f"--gpus must list integers, got {args.gpus!r}") from None
    return AgentSettings(
        gateways=tuple(args.gateway),
        replica=args.replica,
        gpu_indices=gpus,
        interval_s=args.interval_s,
        timeout_s=args.timeout_s,
        admin_key=env.get(KEY_ENV, ""),
        vllm_url=args.vllm_url,
    )


async def _main(settings: AgentSettings) -> None:
    reader: GpuReader | None
    try:
        reader = NvmlReader()
    except AgentError as exc:
        log.warning("%s: heartbeats carry the replica's liveness only", exc)
        reader = None
    connector = aiohttp.TCPConnector(limit=max(4, len(settings.gateways)))
    async with aiohttp.ClientSession(connector=connector) as session:
        log.info(
            "agent for %s: GPUs %s to %s every %.1f s",
            settings.replica,
            ",".join(map(str, settings.gpu_indices)),
            ", ".join(settings.gateways),
            settings.interval_s,
        )
        await Agent(settings, reader, session).run()


def run(args: argparse.Namespace) -> int:
    """The `agent` command: 2 when its settings are wrong."""
    try:
        settings = settings_from(args)
        asyncio.run(_main(settings))
    except AgentError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
