"""The workload's hit-rate ceiling and working set, from its token stream; the KV sizing."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from benchmarks.routing_bench.workloads import BenchRequest
from cache_index.hashing import block_hashes
from vllm_api.chat_template import ChatTemplate, load_chat_template
from vllm_api.tokenizer import Tokenizer, load_tokenizer

WORKING_SET_FRACTION = 0.7


class PromptTokens:
    """A chat request's prompt token ids as the replica computes them (template, then ids).

    The gateway's own tokenizer and template code (vllm_api), over the fleet's tokenizer
    directory; None is the simulator's built-in tokenizer and default template.
    """

    def __init__(self, tokenizer_dir: str | None) -> None:
        self.tokenizer: Tokenizer = load_tokenizer(tokenizer_dir)
        self.template: ChatTemplate = load_chat_template(tokenizer_dir)

    def ids(self, req: BenchRequest) -> list[int]:
        msgs = [{"role": role, "content": text} for role, text in req.messages]
        # A rendered chat carries the template's own BOS: vLLM adds no special tokens to it.
        return self.tokenizer.encode_plain(self.template.render(msgs, add_generation_prompt=True))


@dataclass(frozen=True, slots=True)
class Ceiling:
    """Hit tokens a perfect placement with an unbounded cache would get, over prompt tokens."""

    hit_tokens: int
    prompt_tokens: int

    @property
    def rate(self) -> float | None:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None


def hit_ceiling(streams: Iterable[Sequence[int]], block_size: int) -> Ceiling:
    """Prompts in replay order: a full block hits when its whole chain was in an earlier prompt.

    As vLLM counts: the block holding a prompt's last token never hits (that token is always
    computed), blocks count from the start until the first miss, every prompt token is queried.
    """
    seen: set[int] = set()
    hits = total = 0
    for ids in streams:
        hashes = block_hashes(list(ids), block_size)
        usable = (len(ids) - 1) // block_size if ids else 0
        for h in hashes[:usable]:
            if h not in seen:
                break
            hits += block_size
        total += len(ids)
        seen.update(hashes)
    return Ceiling(hits, total)


def working_set_blocks(streams: Iterable[Sequence[int]], block_size: int) -> int:
    """Distinct full prompt blocks (by their chained hash) over the whole workload."""
    distinct: set[int] = set()
    for ids in streams:
        distinct.update(block_hashes(list(ids), block_size))
    return len(distinct)


@dataclass(frozen=True, slots=True)
class KvSizing:
    """The per-replica cache a workload gets: its working set is `fraction` of the fleet's."""

    working_set_blocks: int
    block_size: int
    replicas: int
    blocks_per_replica: int
    target_fraction: float
    min_blocks: int  # one replica must hold the longest request (vLLM refuses less)

    @property
    def fleet_blocks(self) -> int:
        return self.blocks_per_replica * self.replicas

    @property
    def fraction(self) -> float:
        """The working set over the fleet's cache, as sized (above the target: never)."""
        return self.working_set_blocks / self.fleet_blocks

    def as_json(self) -> dict[str, float | int]:
        return {
            "working_set_blocks": self.working_set_blocks,
            "working_set_tokens": self.working_set_blocks * self.block_size,
            "block_size": self.block_size,
            "replicas": self.replicas,
            "blocks_per_replica": self.blocks_per_replica,
            "fleet_blocks": self.fleet_blocks,
            "fleet_tokens": self.fleet_blocks * self.block_size,
            "target_fraction": self.target_fraction,
            "working_set_vs_fleet_kv": round(self.fraction, 3),
            "min_blocks": self.min_blocks,
        }

    def describe(self) -> str:
        return (
            f"working set {self.working_set_blocks} blocks of {self.block_size} tokens = "
            f"{self.fraction:.0%} of {self.replicas} x {self.blocks_per_replica} blocks"
        )


def size_cache(
    working_set: int,
    replicas: int,
    block_size: int,
    min_blocks: int = 1,
    fraction: float = WORKING_SET_FRACTION,
) -> KvSizing:
    """Blocks per replica so the working set is about `fraction` of the fleet's cache."""
    if replicas < 1 or not 0.0 < fraction <= 1.0:
        raise ValueError(f"need replicas >= 1 and 0 < fraction <= 1, got {replicas}, {fraction}")
    # Rounded first: 700 / (0.7 x 4) is 250.00000000000003 in floating point.
    per = max(min_blocks, math.ceil(round(working_set / (fraction * replicas), 6)), 1)
    return KvSizing(working_set, block_size, replicas, per, fraction, min_blocks)


def context_for(longest_prompt: int, max_tokens: int, step: int = 256) -> int:
    """A context length (multiple of `step`, at least 1024) that fits every request."""
    return max(1024, math.ceil((longest_prompt + max_tokens) / step) * step)
