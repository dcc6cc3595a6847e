"""One simulated vLLM replica: engine, HTTP app, faults and KV-event publisher."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

import zmq
from aiohttp import web

from simulator import handlers
from simulator.config import Faults, SimConfig
from simulator.engine import Engine
from simulator.kv_publisher import KvPublisher, binds
from simulator.metrics import Gauges, render
from simulator.text import OutputVocab, max_chars_per_token
from vllm_api.chat_template import ChatTemplate
from vllm_api.kv_events import KvEvent
from vllm_api.tokenizer import HFTokenizer, Tokenizer

VLLM_VERSION = "0.32.0"


class Replica:
    """A vLLM-compatible server on its own port; everything runs on the caller's event loop."""

    def __init__(
        self,
        config: SimConfig,
        index: int,
        *,
        host: str,
        port: int,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        vocab: OutputVocab,
        zmq_ctx: zmq.Context[zmq.Socket[bytes]] | None,
        kv_endpoint: str | None,
    ) -> None:
        self.config = config
        self.index = index
        self.name = f"sim-{index}"
        self.host = host
        self.port = port
        self.tokenizer = tokenizer
        self.template = template
        self.vocab = vocab
        self.faults: Faults = config.faults
        self.rng = random.Random(config.seed + index)
        self.served = (config.model, *config.lora_adapters)
        self.max_chars_per_token = max_chars_per_token(config.tokenizer)
        self.created = int(time.time())
        self.inflight = 0
        self.publisher: KvPublisher | None = None
        if zmq_ctx is not None and kv_endpoint is not None:
            replay = None
            if config.replay:
                host_part = (
                    kv_endpoint.rsplit(":", 1)[0] if binds(kv_endpoint) else "tcp://127.0.0.1"
                )
                replay = f"{host_part}:*" if host_part.startswith("tcp://") else None
            self.publisher = KvPublisher(
                zmq_ctx,
                kv_endpoint,
                config.kv_events_topic,
                replay_endpoint=replay,
                buffer_steps=config.replay_buffer_steps,
            )
        self.engine = Engine(
            config,
            hash_seed=config.seed * 1_000_003 + index,
            publish=self._publish if self.publisher is not None else None,
        )
        self._started_at = time.monotonic()
        self._slow_until = self._started_at + self.faults.slow_start_seconds
        self._runner: web.AppRunner | None = None
        # vLLM's API server renders one /metrics at a time, on its event loop.
        self._render_free_at = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def kv_events_endpoint(self) -> str | None:
        return None if self.publisher is None else self.publisher.endpoint

    @property
    def replay_endpoint(self) -> str | None:
        return None if self.publisher is None else self.publisher.replay_endpoint

    def _publish(self, events: list[KvEvent]) -> None:
        if self.publisher is not None:
            self.publisher.publish(events)

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application(
            client_max_size=64 * 1024 * 1024, middlewares=[handlers.fastapi_errors]
        )
        app[handlers.REPLICA] = self
        handlers.add_routes(app)
        # Cancelling the handler on disconnect is what frees the engine slot at once.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
        await site.start()
        server = site._server
        if self.port == 0 and server is not None:
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.engine.start()
        if self.publisher is not None:
            self.publisher.start()
        self._started_at = time.monotonic()
        self._slow_until = self._started_at + self.faults.slow_start_seconds

    async def stop(self) -> None:
        await self.engine.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.publisher is not None:
            await self.publisher.close()

    # ---- admin -----------------------------------------------------------------------------
    def set_faults(self, patch: dict[str, Any]) -> Faults:
        new = self.faults.updated(patch)
        if "slow_start_seconds" in patch:
            self._slow_until = time.monotonic() + new.slow_start_seconds
        if new.dead and not self.faults.dead:
            self.engine.fail_all("dead", "Engine loop is not running. Inspect the stacktrace.")
        self.faults = new
        return new

    def restart(self) -> None:
        if self.publisher is not None:
            self.publisher.reset_sequence()  # the AllBlocksCleared batch goes out as seq 0
        self.engine.restart()
        self._started_at = time.monotonic()
        self._slow_until = self._started_at + self.faults.slow_start_seconds

    def healthy(self) -> bool:
        f = self.faults
        return not (f.unhealthy or f.dead or time.monotonic() < self._slow_until)

    async def serve_metrics(self) -> bytes:
        """/metrics as vLLM serves it: renders queue for the API server, and each one's CPU
        time is taken from the engine's next step (SimConfig.metrics_cost_ms)."""
        cost = self.engine.timing.metrics_s()
        if cost > 0:
            now = asyncio.get_running_loop().time()
            self._render_free_at = max(now, self._render_free_at) + cost
            self.engine.charge(cost)
            await asyncio.sleep(self._render_free_at - now)
        return self.metrics()

    def metrics(self) -> bytes:
        c = self.config
        g: Gauges = self.engine.gauges()
        cache_info = {
            "block_size": str(c.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(c.enable_prefix_caching),
            "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(c.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "sha256",
            "sliding_window": "None",
            "swap_space": "4",
        }
        return render(
            self.engine.stats,
            g,
            model=c.model,
            cache_info=cache_info,
            max_lora=c.max_lora if c.lora_adapters else None,
        )

    def new_request_id(self, header: str | None, chat: bool) -> str:
        base = header or uuid.uuid4().hex
        return f"{'chatcmpl' if chat else 'cmpl'}-{base}"

    def encode_prompt(self, text: str, chat: bool) -> list[int]:
        # vLLM tokenizes chat prompts without special tokens: the template already has them.
        if chat and isinstance(self.tokenizer, HFTokenizer):
            return self.tokenizer.encode_plain(text)
        return self.tokenizer.encode(text)
