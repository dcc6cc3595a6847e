"""vLLM's embeddings and pooling answers (vllm/entrypoints/pooling/*/protocol.py, 0.32)."""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Any

# embed_dtype -> struct code (vLLM also serves bfloat16 and fp8 ones, which struct lacks).
EMBED_DTYPES = {"float32": "f", "float16": "e"}
# endianness -> struct byte order; "native" is the server's own, as vLLM's default.
ENDIANNESS = {"native": "=", "little": "<", "big": ">"}
ENCODING_FORMATS = ("float", "base64")


def pooling_usage(prompt_tokens: int) -> dict[str, Any]:
    """vLLM's UsageInfo of a pooling answer: prompt tokens only."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def encode_vector(
    vector: Sequence[float], encoding_format: str, embed_dtype: str = "float32",
    endianness: str = "native",
) -> list[float] | str:  # fmt: skip
    """One vector as vLLM encodes it: a list of floats, or base64 of its packed values."""
    if encoding_format == "float":
        return list(vector)
    code = ENDIANNESS[endianness] + f"{len(vector)}" + EMBED_DTYPES[embed_dtype]
    return base64.b64encode(struct.pack(code, *vector)).decode("ascii")


def decode_base64(
    text: str, embed_dtype: str = "float32", endianness: str = "native"
) -> list[float]:
    """The vector of a base64 embedding (as the openai SDK decodes it: float32, native)."""
    raw = base64.b64decode(text)
    code = EMBED_DTYPES[embed_dtype]
    count = len(raw) // struct.calcsize(code)
    return list(struct.unpack(ENDIANNESS[endianness] + f"{count}{code}", raw))


def _listed(
    response_id: str, created: int, model: str, data: list[dict[str, Any]], prompt_tokens: int
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": pooling_usage(prompt_tokens),
    }


def embedding_response(
    response_id: str,
    created: int,
    model: str,
    embeddings: Sequence[list[float] | str],
    prompt_tokens: int,
) -> dict[str, Any]:
    """POST /v1/embeddings's EmbeddingResponse."""
    data = [{"index": i, "object": "embedding", "embedding": e} for i, e in enumerate(embeddings)]
    return _listed(response_id, created, model, data, prompt_tokens)


def pooling_response(
    response_id: str,
    created: int,
    model: str,
    outputs: Sequence[list[float] | str],
    prompt_tokens: int,
) -> dict[str, Any]:
    """POST /pooling's PoolingResponse."""
    data = [{"index": i, "object": "pooling", "data": d} for i, d in enumerate(outputs)]
    return _listed(response_id, created, model, data, prompt_tokens)
