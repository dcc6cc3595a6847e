"""Chained block hashes: format, chaining properties, character blocks, the prompt hash."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest
import xxhash

from cache_index.hashing import HashingError, block_hashes, char_block_hashes, prompt_hash

RNG = random.Random(1234)
TOKENS = [RNG.randrange(32_000) for _ in range(1000)]


@pytest.mark.parametrize(
    ("n_tokens", "block_size", "expected"),
    [(0, 16, 0), (15, 16, 0), (16, 16, 1), (31, 16, 1), (32, 16, 2), (1000, 16, 62), (7, 1, 7)],
)
def test_full_blocks_only(n_tokens: int, block_size: int, expected: int) -> None:
    assert len(block_hashes(TOKENS[:n_tokens], block_size)) == expected


def test_format_is_le_uint32_chained_through_the_seed() -> None:
    bs = 4
    toks = [1, 2, 70_000, 2**32 - 1, 5, 6, 7, 8]
    first = xxhash.xxh3_64_intdigest(struct.pack("<4I", *toks[:4]) + b"lora", 9)
    second = xxhash.xxh3_64_intdigest(struct.pack("<4I", *toks[4:]), first)
    assert block_hashes(toks, bs, seed=9, extra=b"lora") == [first, second]


def test_same_prefix_same_leading_hashes() -> None:
    a = block_hashes(TOKENS[:320], 16)
    b = block_hashes(TOKENS[:160] + [7] * 160, 16)
    assert a[:10] == b[:10]
    assert all(x != y for x, y in zip(a[10:], b[10:], strict=True))


@pytest.mark.parametrize("changed", [0, 15, 16, 100, 319])
def test_one_changed_token_changes_its_block_and_every_later_one(changed: int) -> None:
    toks = TOKENS[:320]
    other = list(toks)
    other[changed] += 1
    a, b = block_hashes(toks, 16), block_hashes(other, 16)
    k = changed // 16
    assert a[:k] == b[:k]
    assert all(x != y for x, y in zip(a[k:], b[k:], strict=True))


def test_extra_enters_the_first_block_only_and_reaches_later_ones_via_the_chain() -> None:
    plain = block_hashes(TOKENS[:64], 16)
    salted = block_hashes(TOKENS[:64], 16, extra=b"adapter-1")
    assert all(x != y for x, y in zip(plain, salted, strict=True))
    # Continuing a chain from a parent hash takes no extra: the tail rehashes identically.
    assert block_hashes(TOKENS[16:64], 16, seed=salted[0]) == salted[1:]
    assert block_hashes(TOKENS[16:64], 16, seed=plain[0]) == plain[1:]


def test_seed_changes_every_hash() -> None:
    a, b = block_hashes(TOKENS[:64], 16, seed=0), block_hashes(TOKENS[:64], 16, seed=1)
    assert all(x != y for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("bad", [[-1], [2**32], ["x"]])
def test_token_ids_must_fit_uint32(bad: list[object]) -> None:
    with pytest.raises(HashingError):
        block_hashes(bad * 4, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call", [lambda: block_hashes(TOKENS, 0), lambda: char_block_hashes("abc", -1)]
)
def test_block_size_must_be_positive(call: Callable[[], list[int]]) -> None:
    with pytest.raises(HashingError):
        call()


@pytest.mark.parametrize(
    ("text", "block_chars", "expected"),
    [("", 64, 0), ("a" * 63, 64, 0), ("a" * 64, 64, 1), ("é" * 130, 64, 2), ("日本" * 8, 4, 4)],
)
def test_char_blocks_count_characters_not_bytes(text: str, block_chars: int, expected: int) -> None:
    assert len(char_block_hashes(text, block_chars)) == expected


def test_char_blocks_chain_like_token_blocks() -> None:
    text = "".join(chr(RNG.randrange(32, 0x3000)) for _ in range(256))
    first = xxhash.xxh3_64_intdigest(text[:64].encode("utf-8", "surrogatepass") + b"x", 3)
    hashes = char_block_hashes(text, 64, seed=3, extra=b"x")
    assert hashes[0] == first
    assert char_block_hashes(text[64:], 64, seed=first) == hashes[1:]
    edited = text[:130] + "?" + text[131:]
    assert char_block_hashes(edited, 64, seed=3, extra=b"x")[:2] == hashes[:2]
    assert char_block_hashes(edited, 64, seed=3, extra=b"x")[2:] != hashes[2:]


def test_char_blocks_of_ascii_and_non_ascii_texts_agree_on_shared_blocks() -> None:
    shared = "system prompt, plain ASCII. " * 10
    ascii_only = char_block_hashes(shared + "question?" * 10, 64)
    accented = char_block_hashes(shared + "question é?" * 10, 64)
    n = len(shared) // 64
    assert ascii_only[:n] == accented[:n]


def test_prompt_hash_keys_on_model_and_accepts_str_or_bytes() -> None:
    assert prompt_hash("m", "hello") == prompt_hash("m", b"hello")
    assert prompt_hash("m", "hello") != prompt_hash("n", "hello")
    assert prompt_hash("m", "hello") != prompt_hash("m", "hellp")
    assert prompt_hash("m", "hello") == xxhash.xxh3_64_intdigest(
        b"hello", xxhash.xxh3_64_intdigest(b"m")
    )
