"""Per-replica score loop: scrape vLLM's /metrics, keep windowed latencies, track freshness."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

import aiohttp

from gateway.config import ScoreLoopConfig
from gateway.replicas.state import ReplicaState
from vllm_api.metrics import VllmMetrics, parse_vllm_metrics, quantile_from_deltas

log = logging.getLogger("llm_gateway.score_loop")


def restarted(old: VllmMetrics, new: VllmMetrics) -> bool:
    """Whether a cumulative counter went backwards between two scrapes: a new vLLM process."""
    pairs = [(old.requests_ok, new.requests_ok), (old.requests_failed, new.requests_failed)]
    if old.prefix_queries is not None and new.prefix_queries is not None:
        pairs.append((old.prefix_queries, new.prefix_queries))
    return any(now < before for before, now in pairs)


class ScoreLoop:
    """One task per replica; each scrape updates that replica's ReplicaState in place."""

    def __init__(
        self,
        cfg: ScoreLoopConfig,
        session: aiohttp.ClientSession,
        on_capacity: Callable[[str, int], None],
        on_scrape: Callable[[], None] = lambda: None,
        on_restart: Callable[[str], None] = lambda _name: None,
    ) -> None:
        # Told of a replica that restarted: its KV cache is gone, whatever the tiers remember.
        self._on_restart = on_restart
        # Each fresh view of a replica may show room for a request the admission queue holds.
        self._on_scrape = on_scrape
        self._cfg = cfg
        # Told each replica's KV capacity in blocks (vllm:cache_config_info) when it changes.
        self._on_capacity = on_capacity
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=cfg.scrape_timeout_s)
        self._history: dict[str, deque[tuple[float, VllmMetrics]]] = {}

    async def scrape(self, replica: ReplicaState) -> bool:
        """One scrape; False (and the old values kept, ageing) when it fails."""
        try:
            async with self._session.get(
                replica.config.url + "/metrics", timeout=self._timeout
            ) as resp:
                if resp.status != 200:
                    replica.scrape_errors += 1
                    return False
                text = await resp.text()
        except (aiohttp.ClientError, ConnectionError, TimeoutError, UnicodeDecodeError):
            replica.scrape_errors += 1
            return False
        now = time.monotonic()
        metrics = parse_vllm_metrics(text)
        self._apply(replica, metrics, now)
        self._on_scrape()
        return True

    def _apply(self, replica: ReplicaState, m: VllmMetrics, now: float) -> None:
        old = replica.metrics
        # Failed scrapes keep the last good one, so a restart behind a down period shows too.
        if old is not None and restarted(old, m):
            log.info(
                "replica %s restarted (its counters went back): forgetting what it cached",
                replica.name,
            )
            # Latency windows must not span two processes (their deltas would go negative).
            self._history.pop(replica.name, None)
            self._on_restart(replica.name)
            old = None  # and its cache size is told again, to the emptied index
        if m.num_gpu_blocks and (old is None or old.num_gpu_blocks != m.num_gpu_blocks):
            self._on_capacity(replica.name, m.num_gpu_blocks)
        replica.metrics = m
        replica.scraped_at = now
        # Load between scrapes = scraped + the gateway's own changes since (see snapshot()).
        replica.in_flight_at_scrape = replica.in_flight
        if m.running_adapters or replica.loaded_adapters:
            replica.loaded_adapters = m.running_adapters
        history = self._history.setdefault(replica.name, deque())
        history.append((now, m))
        while len(history) > 2 and now - history[0][0] > self._cfg.latency_window_s:
            history.popleft()
        _, oldest = history[0]
        if oldest is m:
            return
        replica.ttft_p50_s = quantile_from_deltas(m.ttft_buckets, oldest.ttft_buckets, 0.5)
        replica.ttft_p99_s = quantile_from_deltas(m.ttft_buckets, oldest.ttft_buckets, 0.99)
        replica.itl_p99_s = quantile_from_deltas(m.itl_buckets, oldest.itl_buckets, 0.99)
        ok = m.requests_ok - oldest.requests_ok
        failed = m.requests_failed - oldest.requests_failed
        replica.error_rate = failed / (ok + failed) if ok + failed > 0 else None

    async def run(self, replica: ReplicaState) -> None:
        """Scrape forever at the configured interval (cancelled by the owner)."""
        loop = asyncio.get_running_loop()
        interval = self._cfg.scrape_interval_s
        next_at = loop.time()
        while True:
            await self.scrape(replica)
            # Fixed cadence: a slow scrape doesn't push every later one back.
            next_at = max(next_at + interval, loop.time())
            await asyncio.sleep(next_at - loop.time())
