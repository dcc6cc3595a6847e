"""The replay's hit-rate ceiling, working set and KV sizing on hand-made token streams."""

import pytest

from benchmarks.replay.ceiling import (
    PromptTokens,
    context_for,
    hit_ceiling,
    size_cache,
    working_set_blocks,
)
from benchmarks.routing_bench.workloads import BenchRequest
from vllm_api.chat_template import ChatTemplate
from vllm_api.tokenizer import BuiltinTokenizer

B = 4  # tokens per block


def test_a_block_repeated_from_an_earlier_prompt_counts() -> None:
    c = hit_ceiling([[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9]], B)
    # Second prompt: both full blocks were in the first, and its last token (9) is past them.
    assert (c.hit_tokens, c.prompt_tokens) == (8, 17)
    assert c.rate == pytest.approx(8 / 17)


def test_a_partial_block_never_counts_nor_is_remembered() -> None:
    # The first prompt's [5, 6] is no full block: the second's block [5..8] was never seen.
    c = hit_ceiling([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9]], B)
    assert c.hit_tokens == 4
    # A prompt's own trailing partial block is not counted either.
    c = hit_ceiling([[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6]], B)
    assert c.hit_tokens == 4


def test_the_last_prompt_token_never_hits() -> None:
    # The same prompt twice: its second block holds the last token, so only the first hits.
    same = [1, 2, 3, 4, 5, 6, 7, 8]
    assert hit_ceiling([same, same], B).hit_tokens == 4
    # One token, seen before: nothing to hit.
    assert hit_ceiling([[1], [1]], B).hit_tokens == 0


def test_a_block_hits_only_with_its_whole_chain() -> None:
    # The second block's tokens repeat, but after another first block: another chain.
    c = hit_ceiling([[1, 2, 3, 4, 5, 6, 7, 8, 0], [9, 9, 9, 9, 5, 6, 7, 8, 0]], B)
    assert c.hit_tokens == 0
    # A miss ends the run: the third block of the second prompt is never reached.
    c = hit_ceiling([[1, 2, 3, 4, 5, 6, 7, 8, 1, 1, 1, 1, 0], [1, 2, 3, 4, 0, 0, 0, 0, 0]], B)
    assert c.hit_tokens == 4


def test_any_earlier_prompt_counts_not_only_the_previous() -> None:
    c = hit_ceiling([[1, 2, 3, 4, 0], [7, 7, 7, 7, 0], [1, 2, 3, 4, 9]], B)
    assert (c.hit_tokens, c.prompt_tokens) == (4, 15)
    assert hit_ceiling([], B).rate is None


def test_working_set_counts_distinct_full_blocks_by_chain() -> None:
    streams = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8], [5, 6, 7, 8, 1]]
    # [1..4], [1..4 | 5..8] and [5..8] (another chain); the partial tails never.
    assert working_set_blocks(streams, B) == 3


def test_cache_is_sized_so_the_working_set_is_70pct_of_the_fleet() -> None:
    kv = size_cache(700, replicas=4, block_size=32)
    assert kv.blocks_per_replica == 250 and kv.fleet_blocks == 1000
    assert kv.fraction == pytest.approx(0.7)
    assert kv.as_json()["working_set_tokens"] == 700 * 32
    # Rounded up: never a cache smaller than the target.
    assert size_cache(701, 4, 32).fraction <= 0.7
    # A replica must hold the longest request, however small the working set.
    small = size_cache(10, 4, 32, min_blocks=64)
    assert small.blocks_per_replica == 64 and small.fraction < 0.7
    assert size_cache(100, 2, 16, fraction=0.5).blocks_per_replica == 100
    with pytest.raises(ValueError):
        size_cache(100, 0, 16)
    with pytest.raises(ValueError):
        size_cache(100, 2, 16, fraction=1.5)


def test_context_fits_the_longest_request() -> None:
    assert context_for(100, 32) == 1024
    assert context_for(2081, 32) == 2304
    assert context_for(2048, 0) == 2048


def test_prompt_tokens_are_the_templated_chat_as_the_replica_sees_it() -> None:
    req = BenchRequest("r", (("system", "be brief"), ("user", "hello there")), 8, "g")
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    text = ChatTemplate().render(msgs, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert PromptTokens(None).ids(req) == BuiltinTokenizer().encode_plain(text)
