"""N simulated replicas in one process, each on its own 127.0.0.1 port."""

from __future__ import annotations

import re
from types import TracebackType

import zmq

from simulator.config import SimConfig, SimError
from simulator.kv_publisher import binds
from simulator.replica import Replica
from simulator.text import OutputVocab
from vllm_api.chat_template import load_chat_template
from vllm_api.tokenizer import load_tokenizer

_PORT = re.compile(r"^(tcp://.+):(\d+)$")


def replica_kv_endpoint(endpoint: str, index: int) -> str:
    """Bound endpoints with a fixed port get port+index (one per replica); others are shared."""
    m = _PORT.match(endpoint)
    if binds(endpoint) and m is not None:
        return f"{m.group(1)}:{int(m.group(2)) + index}"
    return endpoint


class SimFleet:
    """Start/stop N replicas on the running loop; also an async context manager."""

    def __init__(
        self,
        config: SimConfig | None = None,
        replicas: int = 1,
        host: str = "127.0.0.1",
        base_port: int = 0,
    ) -> None:
        if replicas < 1:
            raise SimError("replicas must be >= 1")
        self.config = config or SimConfig()
        self.host = host
        self.base_port = base_port
        self.num_replicas = replicas
        self.replicas: list[Replica] = []
        self._zmq: zmq.Context[zmq.Socket[bytes]] | None = None

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    async def start(self) -> None:
        if self.replicas:
            raise SimError("fleet already started")
        cfg = self.config
        tokenizer = load_tokenizer(cfg.tokenizer)
        template = load_chat_template(cfg.tokenizer)
        vocab = OutputVocab(tokenizer, cfg.seed)
        if cfg.kv_events:
            self._zmq = zmq.Context()
        try:
            for i in range(self.num_replicas):
                rep = Replica(
                    cfg,
                    i,
                    host=self.host,
                    port=self.base_port + i if self.base_port else 0,
                    tokenizer=tokenizer,
                    template=template,
                    vocab=vocab,
                    zmq_ctx=self._zmq,
                    kv_endpoint=replica_kv_endpoint(cfg.kv_events_endpoint, i)
                    if cfg.kv_events
                    else None,
                )
                self.replicas.append(rep)
                await rep.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        replicas, self.replicas = self.replicas, []
        for rep in replicas:
            await rep.stop()
        if self._zmq is not None:
            self._zmq.term()
            self._zmq = None

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
