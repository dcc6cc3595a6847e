"""Chained xxh3 block hashes over token ids or characters, and the whole-prompt hash."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

import xxhash

from cache_index.errors import CacheIndexError

_xxh3 = xxhash.xxh3_64_intdigest
_MASK64 = (1 << 64) - 1
_LITTLE = sys.byteorder == "little"
# A 4-byte unsigned typecode, so token ids pack as uint32 on every platform.
_U32 = "I" if array("I").itemsize == 4 else "L"


class HashingError(CacheIndexError):
    """Bad hashing input: non-positive block size or a token id outside uint32."""


def _chain(data: bytes, step: int, seed: int, extra: bytes) -> list[int]:
    # The parent hash is passed as xxh3's seed instead of being prepended: no per-block
    # concatenation, measured ~20% faster, and the chain still depends on every earlier byte.
    out: list[int] = []
    end = len(data) - step + 1
    if end <= 0:
        return out
    parent = _xxh3(data[:step] + extra, seed & _MASK64)
    out.append(parent)
    append = out.append
    for start in range(step, end, step):
        parent = _xxh3(data[start : start + step], parent)
        append(parent)
    return out


def _check_block(size: int) -> None:
    if size <= 0:
        raise HashingError(f"block size must be positive, got {size}")


def block_hashes(
    token_ids: Sequence[int], block_size: int, *, seed: int = 0, extra: bytes = b""
) -> list[int]:
    """Chained hash of each full block of tokens; `extra` (LoRA name, salt) enters block 0 only."""
    _check_block(block_size)
    try:
        if isinstance(token_ids, list):
            # fromlist skips the generic iterator path: ~30% faster on tokenizer output.
            packed = array(_U32)
            packed.fromlist(token_ids)
        else:
            packed = array(_U32, token_ids)
    except (OverflowError, TypeError) as exc:
        raise HashingError(f"token ids must be uint32: {exc}") from exc
    if not _LITTLE:
        packed.byteswap()
    return _chain(packed.tobytes(), block_size * packed.itemsize, seed, extra)


def char_block_hashes(
    text: str, block_chars: int = 64, *, seed: int = 0, extra: bytes = b""
) -> list[int]:
    """Chained hash of each full `block_chars`-character block (no tokenizer configured).

    Each block is hashed as its own UTF-8 bytes, so a block's hash never depends on the
    characters after it; ASCII text (the common case) is encoded once and sliced.
    """
    _check_block(block_chars)
    if text.isascii():
        return _chain(text.encode("ascii"), block_chars, seed, extra)
    out: list[int] = []
    end = len(text) - block_chars + 1
    if end <= 0:
        return out
    parent = _xxh3(text[:block_chars].encode("utf-8", "surrogatepass") + extra, seed & _MASK64)
    out.append(parent)
    for start in range(block_chars, end, block_chars):
        block = text[start : start + block_chars].encode("utf-8", "surrogatepass")
        parent = _xxh3(block, parent)
        out.append(parent)
    return out


def prompt_hash(model: str, prompt: str | bytes) -> int:
    """xxh3_64 of the whole templated prompt, keyed by the model name."""
    body = prompt.encode("utf-8", "surrogatepass") if isinstance(prompt, str) else prompt
    return _xxh3(body, _xxh3(model.encode("utf-8", "surrogatepass")))
