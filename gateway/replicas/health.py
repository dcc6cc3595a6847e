"""Active health checks with thresholds, and model discovery from each replica's /v1/models.

The pool applies each threshold crossing: a passing probe never ends a passive ejection
early, and a replica coming back up ramps to its full share (pool.py, outlier.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson

from gateway.config import HealthCheckConfig
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.state import ReplicaState

log = logging.getLogger("llm_gateway.health")

# Model lists change rarely (LoRA loads); refresh them every this many probes.
_MODELS_REFRESH_EVERY = 10


class HealthChecker:
    """Probes one replica at a time; marks it up/down after threshold consecutive results."""

    def __init__(
        self, cfg: HealthCheckConfig, session: aiohttp.ClientSession, pool: ReplicaPool
    ) -> None:
        self._cfg = cfg
        self._pool = pool
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
        self._successes: dict[str, int] = {}
        self._probes: dict[str, int] = {}

    async def _get(self, url: str) -> tuple[int, bytes]:
        async with self._session.get(url, timeout=self._timeout) as resp:
            return resp.status, await resp.read()

    async def _discover(self, replica: ReplicaState) -> bool:
        status, body = await self._get(replica.config.url + "/v1/models")
        if status != 200:
            return False
        data: Any = orjson.loads(body)
        cards = tuple(c for c in data.get("data", ()) if isinstance(c, dict) and "id" in c)
        replica.model_cards = cards
        if not replica.config.models:
            replica.models = frozenset(str(c["id"]) for c in cards)
        return True

    async def probe(self, replica: ReplicaState) -> None:
        """One health probe (plus discovery when due), then apply the thresholds."""
        name = replica.name
        count = self._probes.get(name, 0)
        self._probes[name] = count + 1
        ok = False
        try:
            status, _ = await self._get(replica.config.url + self._cfg.path)
            ok = status == 200
            reason = f"health status {status}"
            if ok and (not replica.model_cards or count % _MODELS_REFRESH_EVERY == 0):
                ok = await self._discover(replica)
                reason = "model discovery failed"
        except (aiohttp.ClientError, ConnectionError, TimeoutError, ValueError) as exc:
            reason = type(exc).__name__
        if ok:
            replica.consecutive_failures = 0
            self._successes[name] = self._successes.get(name, 0) + 1
            if self._successes[name] >= self._cfg.healthy_threshold:
                self._pool.probe_passed(replica)
            return
        self._successes[name] = 0
        replica.consecutive_failures += 1
        replica.last_error = reason
        if replica.consecutive_failures >= self._cfg.unhealthy_threshold:
            self._pool.probe_failed(replica, reason)

    async def run(self, replica: ReplicaState) -> None:
        """Probe forever at the configured interval (cancelled by the owner's task group)."""
        while True:
            await self.probe(replica)
            await asyncio.sleep(self._cfg.interval_s)
