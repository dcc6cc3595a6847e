"""Tier 2 prefix index: matching, approximate LRU, precise KV events, bounds."""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgpack
import pytest

from cache_index.errors import CacheIndexError
from cache_index.hashing import block_hashes
from cache_index.prefix_index import PrefixIndex
from vllm_api.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    UnknownEvent,
    decode_batch,
    encode_batch,
)

BS = 4
RNG = random.Random(7)
VLLM_SEED = 0xABCDEF  # vLLM hashes differently (SHA-256, per-process seed): any other chain


def prompt(n_blocks: int) -> list[int]:
    return [RNG.randrange(32_000) for _ in range(n_blocks * BS)]


def vllm(tokens: Sequence[int], seed: int = VLLM_SEED) -> list[int]:
    return block_hashes(tokens, BS, seed=seed)


def stored(
    tokens: Sequence[int],
    start: int,
    stop: int,
    *,
    seed: int = VLLM_SEED,
    lora: str | None = None,
    medium: str | None = "GPU",
) -> BlockStored:
    """vLLM's BlockStored for blocks [start, stop) of `tokens`."""
    hashes = vllm(tokens, seed)
    return BlockStored(
        block_hashes=tuple(hashes[start:stop]),
        parent_block_hash=hashes[start - 1] if start else None,
        token_ids=tuple(tokens[start * BS : stop * BS]),
        block_size=BS,
        lora_name=lora,
        medium=medium,
    )


def batch(*events: KvEvent) -> EventBatch:
    return EventBatch(ts=0.0, events=events)


def own(tokens: Sequence[int]) -> list[int]:
    return block_hashes(tokens, BS)


def test_match_counts_consecutive_leading_blocks_only() -> None:
    a, b, c, d, x = 1, 2, 3, 4, 99
    idx = PrefixIndex()
    idx.record_routed("r1", [a, b, c], now=0.0)
    idx.record_routed("r2", [a, b], now=0.0)
    idx.record_routed("r3", [a, c], now=0.0)
    idx.record_routed("r4", [b, c], now=0.0)
    assert idx.match([a, b, c, d]) == {"r1": 3, "r2": 2, "r3": 1}
    assert idx.match([a, b]) == {"r1": 2, "r2": 2, "r3": 1}
    assert idx.match([x, a]) == {}
    assert idx.match([]) == {}


def test_approximate_lru_is_bounded_by_capacity_and_evicts_tails_first() -> None:
    idx = PrefixIndex()
    idx.set_capacity("r", 4)
    idx.record_routed("r", [1, 2, 3], now=0.0)
    idx.record_routed("r", [4, 5], now=1.0)
    assert idx.match([1, 2, 3]) == {"r": 2}
    assert idx.match([4, 5]) == {"r": 2}
    for i in range(40):
        idx.record_routed("r", [100 + i, 200 + i], now=2.0 + i)
        assert len(idx) <= 4
    assert idx.match([139, 239]) == {"r": 2}
    assert idx.match([1]) == {}


@pytest.mark.parametrize(("ratio", "blocks", "expected"), [(1.0, 10, 10), (4.0, 10, 40)])
def test_approx_ratio_scales_capacity(ratio: float, blocks: int, expected: int) -> None:
    idx = PrefixIndex(approx_ratio=ratio)
    idx.set_capacity("r", blocks)
    idx.record_routed("r", list(range(1000)), now=0.0)
    assert len(idx) == expected
    assert idx.blocks("r") == expected and idx.blocks("unknown") == 0


def test_default_capacity_and_total_cap_hold_at_ten_times_capacity() -> None:
    idx = PrefixIndex(default_capacity=100, max_total_blocks=250)
    for step in range(100):
        for r in ("a", "b", "c", "d"):
            base = step * 10_000 + ord(r) * 100
            idx.record_routed(r, list(range(base, base + 10)), now=float(step))
            assert len(idx) <= 250
    sizes = {name: s.blocks for name, s in idx.stats().items()}
    assert sum(sizes.values()) == 250
    assert min(sizes.values()) >= 50  # the biggest replica gives way, so none is starved


def test_remove_replica_frees_its_bit_for_reuse() -> None:
    idx = PrefixIndex(max_replicas=2)
    idx.record_routed("a", [1, 2], now=0.0)
    idx.record_routed("b", [1], now=0.0)
    with pytest.raises(CacheIndexError):
        idx.record_routed("c", [1], now=0.0)
    idx.remove_replica("a")
    assert idx.match([1, 2]) == {"b": 1}
    idx.record_routed("c", [1, 2], now=0.0)
    assert idx.match([1, 2]) == {"b": 1, "c": 2}
    assert idx.replicas() == ["b", "c"]


def test_precise_events_place_chains_under_own_hashes() -> None:
    p = prompt(6)
    idx = PrefixIndex()
    idx.apply_events("r", batch(stored(p, 0, 4)), seq=0)
    assert idx.mode("r") == "precise"
    assert idx.match(own(p)) == {"r": 4}
    idx.apply_events("r", batch(stored(p, 4, 6)), seq=1)
    assert idx.match(own(p)) == {"r": 6}
    idx.apply_events("r", batch(BlockRemoved(block_hashes=(vllm(p)[2],), medium="GPU")), seq=2)
    assert idx.match(own(p)) == {"r": 2}
    idx.apply_events("r", batch(AllBlocksCleared()), seq=3)
    assert idx.match(own(p)) == {}
    assert idx.mode("r") == "precise"
    s = idx.stats()["r"]
    assert (s.batches, s.events_applied, s.gaps, s.unplaceable_blocks) == (4, 4, 0, 0)


def test_record_routed_is_ignored_in_precise_mode() -> None:
    idx = PrefixIndex()
    idx.apply_events("r", batch(), seq=0)
    idx.record_routed("r", own(prompt(3)), now=0.0)
    assert len(idx) == 0


def test_unknown_parent_is_counted_not_placed() -> None:
    p = prompt(4)
    idx = PrefixIndex()
    idx.apply_events("r", batch(stored(p, 2, 4)), seq=0)
    assert idx.match(own(p)) == {}
    assert idx.stats()["r"].unplaceable_blocks == 2


def test_tokens_that_do_not_fill_the_blocks_are_unplaceable() -> None:
    p = prompt(2)
    ev = stored(p, 0, 2)
    short = BlockStored(ev.block_hashes, None, ev.token_ids[:-1], BS, None, "GPU")
    idx = PrefixIndex()
    idx.apply_events("r", batch(short), seq=0)
    assert idx.stats()["r"].unplaceable_blocks == 2


@pytest.mark.parametrize(
    "event",
    [
        UnknownEvent(type="Future"),
        BlockStored((1,), None, (1, 2, 3, 4), BS, None, "CPU"),
        BlockStored((1,), None, (1, 2, 3, 4), BS, None, "GPU", group_idx=1),
    ],
)
def test_other_media_groups_and_event_types_are_ignored(event: KvEvent) -> None:
    idx = PrefixIndex()
    idx.apply_events("r", batch(event), seq=0)
    assert len(idx) == 0
    assert idx.stats()["r"].ignored_events == 1


def test_gap_falls_back_to_approximate_seeded_with_the_precise_view() -> None:
    p, q = prompt(4), prompt(3)
    idx = PrefixIndex()
    idx.apply_events("r", batch(stored(p, 0, 4)), seq=0)
    idx.apply_events("r", batch(), seq=1)
    idx.apply_events("r", batch(), seq=5)
    assert idx.mode("r") == "approximate"
    assert idx.stats()["r"].gaps == 1
    assert idx.match(own(p)) == {"r": 4}
    idx.record_routed("r", own(q), now=0.0)
    assert idx.match(own(q)) == {"r": 3}


def test_chains_rooted_before_the_gap_keep_the_replica_approximate() -> None:
    root = prompt(2)
    idx = PrefixIndex(resync_window_blocks=8, resync_miss_rate=0.1)
    idx.apply_events("r", batch(stored(root, 0, 2)), seq=0)
    idx.apply_events("r", batch(), seq=2)  # gap
    for seq in range(3, 40):
        tail = root + prompt(2)
        idx.apply_events("r", batch(stored(tail, 2, 4)), seq=seq)
    assert idx.mode("r") == "approximate"
    assert idx.stats()["r"].unplaceable_blocks == 74


def test_resynchronises_once_new_chains_place_again() -> None:
    old, idx = prompt(2), PrefixIndex(resync_window_blocks=8, resync_miss_rate=0.1)
    idx.apply_events("r", batch(stored(old, 0, 2)), seq=0)
    idx.apply_events("r", batch(), seq=2)  # gap: `old` is kept as an approximate guess
    fresh = [prompt(2) for _ in range(20)]
    seq = 3
    for p in fresh:
        idx.apply_events("r", batch(stored(p, 0, 2)), seq=seq)
        seq += 1
        if idx.mode("r") == "precise":
            break
    assert idx.mode("r") == "precise"
    assert idx.stats()["r"].resyncs == 1
    assert idx.match(own(old)) == {}  # guesses are dropped, only event-backed blocks remain
    assert idx.match(own(fresh[0])) == {"r": 2}


def test_seq_restart_at_zero_clears_and_resyncs() -> None:
    p = prompt(3)
    idx = PrefixIndex()
    idx.apply_events("r", batch(stored(p, 0, 3)), seq=0)
    idx.apply_events("r", batch(), seq=1)
    idx.apply_events("r", batch(), seq=7)  # gap
    idx.apply_events("r", batch(stored(p, 0, 1, seed=99)), seq=0)
    assert idx.mode("r") == "precise"
    assert idx.match(own(p)) == {"r": 1}
    assert idx.stats()["r"].restarts == 1


def test_joining_mid_stream_starts_approximate_and_replay_end_marker_is_ignored() -> None:
    p = prompt(2)
    idx = PrefixIndex()
    idx.apply_events("r", batch(stored(p, 0, 2)), seq=41)
    assert idx.mode("r") == "approximate"
    assert idx.stats()["r"].gaps == 0
    idx.apply_events("r", batch(), seq=-1)
    idx.apply_events("r", batch(), seq=42)
    assert idx.stats()["r"].gaps == 0


def test_allblockscleared_resynchronises_a_desynchronised_replica() -> None:
    idx = PrefixIndex()
    idx.apply_events("r", batch(), seq=3)
    idx.record_routed("r", [1, 2], now=0.0)
    idx.apply_events("r", batch(AllBlocksCleared()), seq=4)
    assert idx.mode("r") == "precise"
    assert idx.match([1, 2]) == {}


def test_lora_name_enters_the_own_hash() -> None:
    p = prompt(2)
    idx = PrefixIndex()
    idx.apply_events("r", batch(stored(p, 0, 2, lora="ad1")), seq=0)
    assert idx.match(own(p)) == {}
    assert idx.match(block_hashes(p, BS, extra=b"ad1")) == {"r": 2}


def test_two_vllm_hashes_for_one_own_hash_are_reference_counted() -> None:
    p = prompt(2)
    idx = PrefixIndex()
    idx.apply_events("r", batch(stored(p, 0, 2), stored(p, 0, 2, seed=5)), seq=0)
    idx.apply_events("r", batch(BlockRemoved(tuple(vllm(p)), "GPU")), seq=1)
    assert idx.match(own(p)) == {"r": 2}
    idx.apply_events("r", batch(BlockRemoved(tuple(vllm(p, 5)), "GPU")), seq=2)
    assert idx.match(own(p)) == {}


def test_precise_map_is_bounded_by_capacity() -> None:
    idx = PrefixIndex()
    idx.set_capacity("r", 8)
    for seq in range(80):
        idx.apply_events("r", batch(stored(prompt(4), 0, 4)), seq=seq)
        assert len(idx) <= 8


def test_custom_tokens_to_hashes_receives_the_parents_own_hash() -> None:
    calls: list[tuple[int, int, str | None, int | None]] = []

    def t2h(tokens: Sequence[int], bs: int, lora: str | None, parent: int | None) -> list[int]:
        calls.append((len(tokens), bs, lora, parent))
        return [(parent or 0) + i + 1 for i in range(len(tokens) // bs)]

    p = prompt(3)
    idx = PrefixIndex()
    idx.apply_events(
        "r", batch(stored(p, 0, 2, lora="x"), stored(p, 2, 3)), seq=0, tokens_to_hashes=t2h
    )
    assert calls == [(8, BS, "x", None), (4, BS, None, 2)]
    assert idx.match([1, 2, 3]) == {"r": 3}


def test_both_wire_encodings_feed_the_same_index() -> None:
    p = prompt(3)
    ev = stored(p, 0, 3)
    tagged = encode_batch(batch(ev))
    positional = msgpack.packb(
        [1.0, [["BlockStored", list(ev.block_hashes), None, list(ev.token_ids), BS, None, "GPU"]]]
    )
    for i, payload in enumerate((tagged, positional)):
        idx = PrefixIndex()
        idx.apply_events(f"r{i}", decode_batch(payload), seq=0)
        assert idx.match(own(p)) == {f"r{i}": 3}
