"""The gateway's use of the cache index: hashing the templated prompt, tiers, thread offload."""

from __future__ import annotations

import threading

import orjson
import pytest

from cache_index.hashing import block_hashes
from gateway.config import CacheIndexConfig
from gateway.proxy.affinity import Affinity
from gateway.proxy.requests import parse_request
from routing.types import RequestFeatures
from vllm_api.tokenizer import BuiltinTokenizer


def _affinity(tokenizer: str = "builtin") -> Affinity:
    return Affinity(CacheIndexConfig(tokenizer=tokenizer), is_lora=lambda m: m == "lora-a")


def _completion(prompt: str, model: str = "m") -> bytes:
    return orjson.dumps({"model": model, "prompt": prompt, "max_tokens": 1})


def test_token_blocks_match_the_replicas_tokenizer() -> None:
    prompt = "word " * 100
    f = _affinity().features(parse_request("completions", _completion(prompt), "r1"), [])
    assert f.block_hashes == tuple(block_hashes(BuiltinTokenizer().encode(prompt), 16))
    assert f.prompt_tokens == len(BuiltinTokenizer().encode(prompt))
    lora = _affinity().features(
        parse_request("completions", _completion(prompt, "lora-a"), "r"), []
    )
    assert lora.block_hashes[0] != f.block_hashes[0]  # adapters cache apart from the base model


def test_whole_templated_chat_is_hashed() -> None:
    def chat(system: str) -> bytes:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]
        return orjson.dumps({"model": "m", "messages": messages})

    a = _affinity("").features(parse_request("chat", chat("rules A " * 40), "r"), [])
    b = _affinity("").features(parse_request("chat", chat("rules B " * 40), "r"), [])
    assert a.prompt_hash != b.prompt_hash and a.block_hashes[0] != b.block_hashes[0]


def _tiers(f: RequestFeatures) -> tuple[str | None, str | None, str | None]:
    """Each tier's candidate: prompt cache, session, prefix home."""
    return f.prompt_cache_replica, f.session_replica, f.prefix_home_replica


def test_tiers_answer_after_record() -> None:
    aff = _affinity()
    req = parse_request("completions", _completion("same prompt " * 20), "r1")
    headers = [(b"x-session-id", b"s-1")]
    first = aff.features(req, headers)
    assert _tiers(first) == (None, None, None) and first.session == "s-1"
    aff.record(first, "rep-2")
    again = aff.features(req, headers)
    # Every tier answers (the routing profile orders them); none is chosen here.
    assert _tiers(again) == ("rep-2", "rep-2", None)
    assert (again.affinity_replica, again.affinity_kind) == (None, None)
    assert again.prefix_match == {"rep-2": len(first.block_hashes)}
    other = aff.features(parse_request("completions", _completion("other"), "r2"), headers)
    assert _tiers(other) == (None, "rep-2", None)
    assert _tiers(aff.features(req, [])) == ("rep-2", None, None)  # no session id
    aff.forget_replica("rep-2")
    assert _tiers(aff.features(req, headers)) == (None, None, None)


@pytest.mark.parametrize("words", [10, 5000])
async def test_long_prompts_are_tokenized_off_the_loop(words: int) -> None:
    aff = _affinity()
    threads: set[str] = set()
    digest = aff.digest

    def spy(req):  # type: ignore[no-untyped-def]
        threads.add(threading.current_thread().name)
        return digest(req)

    aff.digest = spy  # type: ignore[method-assign]
    req = parse_request("completions", _completion("token " * words), "r")
    got = await aff.features_off_loop(req, [])
    assert (threads == {threading.main_thread().name}) == (words < 4096)
    assert got == aff.features(req, [])


def test_an_evicted_prefix_goes_home_on_precise_replicas_only() -> None:
    from vllm_api.kv_events import AllBlocksCleared, EventBatch

    aff = _affinity()
    # seq 0 with a cache reset: the replica's index is precise (and empty: nothing stored).
    aff.prefixes.apply_events("rep-p", EventBatch(0.0, (AllBlocksCleared(),)), 0)
    system = "shared system prompt " * 30

    def ask(q: str, rid: str) -> RequestFeatures:
        return aff.features(parse_request("completions", _completion(system + q), rid), [])

    first = ask("first?", "r1")
    aff.record(first, "rep-p")
    again = ask("second?", "r2")
    assert again.prefix_match == {}  # no KV event says rep-p holds it
    assert _tiers(again) == (None, None, "rep-p")
    # An approximate replica's routing history is its index: a match, not a home.
    aff.record(again, "rep-a")
    third = ask("third?", "r3")
    assert third.prefix_match and set(third.prefix_match) == {"rep-a"}
    assert _tiers(third) == (None, None, None)


@pytest.mark.parametrize(("ratio", "remembered"), [(1.0, False), (4.0, True)])
def test_history_ratio_keeps_a_prefix_beyond_the_replicas_cache(
    ratio: float, remembered: bool
) -> None:
    from dataclasses import replace

    aff = Affinity(replace(CacheIndexConfig(), history_ratio=ratio), is_lora=lambda m: False)
    aff.prefixes.set_capacity("rep", 40)  # vLLM's cache: 40 blocks

    def feats(prompt: str, rid: str) -> RequestFeatures:
        return aff.features(parse_request("completions", _completion(prompt), rid), [])

    group = feats("group system prompt " * 40, "g")  # ~13 character blocks
    aff.record(group, "rep")
    for i in range(3):  # other traffic: ~39 blocks, more than the cache holds with the group
        aff.record(feats(f"unrelated {i} " * 70, f"u{i}"), "rep")
    again = feats("group system prompt " * 40, "g2")
    assert (again.prefix_match.get("rep") == len(group.block_hashes)) is remembered


@pytest.mark.parametrize("tokenizer", ["builtin", ""])
def test_token_id_prompts_are_hashed_by_their_ids(tokenizer: str) -> None:
    aff = _affinity(tokenizer)

    def features(prompt: object) -> RequestFeatures:
        body = orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 1})
        return aff.features(parse_request("completions", body, "r"), [])

    ids = list(range(100, 164))
    a, b = features(ids), features([*ids[:-1], 7])
    # Distinct prompts, distinct prompt hashes (all id prompts once hashed as ""), same blocks.
    assert a.prompt_hash != b.prompt_hash and a.prompt_hash == features(ids).prompt_hash
    assert a.prompt_hash != features("hello").prompt_hash
    assert a.prompt_tokens == 64 and features([ids]).prompt_hash == a.prompt_hash
    size = 16 if tokenizer else aff.block_tokens
    assert a.block_hashes == tuple(block_hashes(ids, size))
    assert a.block_hashes[:-1] == b.block_hashes[:-1] != ()
