"""Subscribe to each replica's vLLM KV-cache events (ZMQ) and feed the precise prefix index."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import aiohttp
import orjson
import zmq
import zmq.asyncio

from cache_index.errors import CacheIndexError
from cache_index.prefix_index import PrefixIndex
from gateway.replicas.state import ReplicaState
from vllm_api.kv_events import decode_batch, decode_seq

log = logging.getLogger("llm_gateway.kv_events")

# A replica's publisher is re-resolved after this long without a message (it may have moved).
_RECV_POLL_S = 1.0


async def resolve_endpoint(
    replica: ReplicaState, session: aiohttp.ClientSession, timeout_s: float
) -> str | None:
    """The ZMQ endpoint to connect to: configured, or learnt from GET /kv_event_sources."""
    configured = replica.config.kv_events
    if configured != "auto":
        return configured or None
    try:
        async with session.get(
            replica.config.url + "/kv_event_sources",
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status != 200:
                return None
            sources = orjson.loads(await resp.read())
    except (aiohttp.ClientError, ConnectionError, TimeoutError, orjson.JSONDecodeError):
        return None
    # Data-parallel rank 0; vLLM publishes one endpoint per rank.
    source = sources.get("0") if isinstance(sources, dict) else None
    endpoint = source.get("endpoint") if isinstance(source, dict) else None
    if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
        return None
    # A publisher bound to all interfaces ("tcp://*:5557") is reached at the replica's host.
    host = urlsplit(replica.config.url).hostname or "127.0.0.1"
    return endpoint.replace("*", host, 1) if "//*:" in endpoint else endpoint


class KvEventSubscriber:
    """One SUB socket per replica; every batch goes to the prefix index with its sequence."""

    def __init__(self, index: PrefixIndex, session: aiohttp.ClientSession) -> None:
        self._index = index
        self._session = session
        self._ctx = zmq.asyncio.Context.instance()
        self.batches: dict[str, int] = {}
        self.decode_errors: dict[str, int] = {}

    async def run(self, replica: ReplicaState) -> None:
        """Connect, receive and apply forever (cancelled by the owner's task group)."""
        endpoint = None
        while endpoint is None:
            endpoint = await resolve_endpoint(replica, self._session, timeout_s=2.0)
            if endpoint is None:
                await asyncio.sleep(5.0)  # replica down or events disabled: ask again later
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(endpoint)
        log.info("replica %s: KV events from %s", replica.name, endpoint)
        try:
            while True:
                if not await sock.poll(timeout=int(_RECV_POLL_S * 1000)):
                    continue
                frames = await sock.recv_multipart()
                self._apply(replica.name, frames)
                replica.cached_blocks = self._index.blocks(replica.name)
        finally:
            sock.close(0)

    def _apply(self, name: str, frames: list[bytes]) -> None:
        try:
            if len(frames) != 3:
                raise CacheIndexError(f"expected 3 frames, got {len(frames)}")
            seq = decode_seq(frames[1])
            batch = decode_batch(frames[2])
            self._index.apply_events(name, batch, seq)
        except CacheIndexError as exc:
            self.decode_errors[name] = self.decode_errors.get(name, 0) + 1
            log.warning("replica %s: undecodable KV-event message: %s", name, exc)
            return
        self.batches[name] = self.batches.get(name, 0) + 1
