"""A pooling replica's routes (vLLM --runner pooling --convert embed): embeddings, /pooling.

Vectors are derived from the token ids alone (the same input always embeds the same way, on
every replica); shapes, usage and errors are vLLM 0.32's (vllm/entrypoints/pooling/).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
import uuid
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from aiohttp import web

from simulator import generation as G
from simulator import protocol as P
from simulator.config import SimError
from simulator.http_util import api_error_response, error_response, json_response, replica_of
from vllm_api import pooling as V
from vllm_api.errors import VllmApiError

if TYPE_CHECKING:
    from simulator.replica import Replica

# What a converted embedding model supports (vLLM's supported_tasks for it, in its order);
# /pooling serves only the model's own pooling task, embed.
SUPPORTED_TASKS = ("token_embed", "embed")


@lru_cache(maxsize=65536)
def _token_vector(token: int, size: int) -> tuple[float, ...]:
    """A token's fixed pseudo-random vector in [-1, 1]^size."""
    out: list[float] = []
    block = 0
    while len(out) < size:
        digest = hashlib.blake2b(
            token.to_bytes(8, "little", signed=True), digest_size=64, salt=block.to_bytes(16)
        ).digest()
        out.extend((b - 127.5) / 127.5 for b in digest)
        block += 1
    return tuple(out[:size])


def _normalize(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm > 0 else vector


def embed(ids: list[int], size: int, dimensions: int | None, activation: bool) -> list[float]:
    """Mean of the tokens' vectors, cut to `dimensions` (Matryoshka), then L2-normalised."""
    total = [0.0] * size
    for token in ids:
        for i, v in enumerate(_token_vector(token, size)):
            total[i] += v
    n = max(1, len(ids))
    vector = [v / n for v in total][: dimensions or size]
    return _normalize(vector) if activation else vector


def _prompts(rep: Replica, body: dict[str, Any]) -> list[list[int]]:
    """The token ids of each input: a string, strings, token ids, lists of them, or a chat."""
    # vLLM tokenizes text with truncation at max_model_len + 1 (a longer text counts as "at
    # least" that); token ids are counted in full.
    cap = rep.config.max_model_len + 1
    messages = body.get("messages")
    raw = body.get("input")
    if messages is None and isinstance(raw, list) and raw and isinstance(raw[0], dict):
        messages = raw  # vLLM's EmbeddingChatInputRequest: one conversation in `input`
    if messages is not None:
        if not isinstance(messages, list) or not messages:
            raise P.invalid("List should have at least 1 item", "body.messages")
        gen = body.get("add_generation_prompt") is True  # False for pooling, unlike chat
        return [rep.encode_prompt(rep.template.render(messages, gen), chat=True)[:cap]]
    if raw is None:
        raise P.invalid("Field required", "body.input")
    if isinstance(raw, str):
        return [rep.encode_prompt(raw, chat=False)[:cap]]
    if not isinstance(raw, list):
        raise P.invalid("Input should be a valid list or string", "body.input")
    if all(isinstance(x, int) and not isinstance(x, bool) for x in raw) and raw:
        return [list(raw)]
    if all(isinstance(x, str) for x in raw):
        return [rep.encode_prompt(x, chat=False)[:cap] for x in raw]
    if all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in raw):
        return [list(x) for x in raw]
    raise P.invalid("Input should be a valid list of integers or strings", "body.input")


def _options(body: dict[str, Any]) -> tuple[str, str, str, bool]:
    """Pydantic's checks of the encoding fields (vLLM's RequestValidationError, 400)."""
    fmt = body.get("encoding_format", "float")
    if fmt not in V.ENCODING_FORMATS:
        # vLLM also serves "bytes" and "bytes_only" (a binary body): not simulated.
        msg = "Input should be 'float', 'base64', 'bytes' or 'bytes_only'"
        raise P.invalid(msg, "body.encoding_format")
    dtype = body.get("embed_dtype", "float32")
    if dtype not in V.EMBED_DTYPES:
        msg = f"Input should be one of {sorted(V.EMBED_DTYPES)} (the simulator's)"
        raise P.invalid(msg, "body.embed_dtype")
    order = body.get("endianness", "native")
    if order not in V.ENDIANNESS:
        raise P.invalid("Input should be 'native', 'big' or 'little'", "body.endianness")
    if "normalize" in body:
        msg = "Parameter `normalize` was removed; use `use_activation` instead."
        raise P.bad_request(msg, "normalize")
    return fmt, dtype, order, body.get("use_activation") is not False


def _check_lengths(rep: Replica, ids: list[list[int]]) -> None:
    if not ids:
        raise P.bad_request("You must pass at least one prompt")
    max_len = rep.config.max_model_len
    for prompt in ids:
        if len(prompt) > max_len:
            # vLLM's words: "at least" at exactly max_len + 1, where text is truncated.
            qualifier = "at least " if len(prompt) == max_len + 1 else ""
            msg = (
                f"This model's maximum context length is {max_len} tokens. However, your "
                f"prompt contains {qualifier}{len(prompt)} input tokens, which exceeds this "
                "limit even without any output tokens. Please reduce the length of the input "
                "prompt."
            )
            raise P.bad_request(msg, "input_tokens", len(prompt))


def _dimensions(rep: Replica, body: dict[str, Any]) -> int | None:
    dims = body.get("dimensions")
    if dims is None:
        return None
    name, size = rep.served[0], rep.config.embedding_size
    if not isinstance(dims, int) or isinstance(dims, bool):
        raise P.invalid("Input should be a valid integer", "body.dimensions")
    if not rep.config.matryoshka:
        raise P.bad_request(
            f"Model {name!r} does not support Matryoshka embeddings; dimensions must be unset "
            f"(received dimensions={dims})."
        )
    if not 1 <= dims <= size:
        msg = f"Model {name!r} only supports dimensions in range [1, {size}], got {dims}."
        raise P.bad_request(msg)
    return dims


def _pooling_task(body: dict[str, Any]) -> None:
    """/pooling serves the model's own task only (vLLM's _verify_pooling_task)."""
    if body.get("dimensions") is not None:
        raise P.bad_request("dimensions is currently not supported", "dimensions")
    task = body.get("task") or "embed"
    if task not in SUPPORTED_TASKS:
        supported = list(SUPPORTED_TASKS)
        raise P.bad_request(f"Unsupported task: {task!r} Supported tasks: {supported}", "task")
    if task != "embed":
        msg = f"Try switching the model's pooling_task via --pooler-config.task {task}."
        raise P.bad_request(msg, "task")


def _model(rep: Replica, body: dict[str, Any]) -> str:
    """The served name the answer reports; 404 for another (vLLM's pooling check: no aliases)."""
    model = body.get("model")
    if model is None:
        return rep.served[0]
    if model not in rep.served:
        raise P.ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
    return str(model)


async def _serve(request: web.Request, route: str) -> web.StreamResponse:
    rep = replica_of(request)
    if (early := await G.early_answer(request, rep)) is not None:
        return early
    # vLLM's order: the request model, the task, the model name, pooling params, the prompts.
    try:
        body = P.parse_body(await request.read())
        fmt, dtype, order, activation = _options(body)
        if route == "pooling":
            _pooling_task(body)
        model = _model(rep, body)
        dims = _dimensions(rep, body) if route == "embeddings" else None
        ids = _prompts(rep, body)
        _check_lengths(rep, ids)
    except P.ApiError as exc:
        return api_error_response(exc)
    except (SimError, VllmApiError) as exc:
        return error_response(400, str(exc))
    tokens = sum(map(len, ids))
    rep.inflight += 1
    try:
        # The forward pass: a prefill of every input, as the engine would batch it.
        await asyncio.sleep(rep.config.timing.prefill_s(tokens))
    finally:
        rep.inflight -= 1
    size = rep.config.embedding_size
    outputs = [
        V.encode_vector(embed(prompt, size, dims, activation), fmt, dtype, order) for prompt in ids
    ]
    base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    if route == "pooling":
        answer = V.pooling_response(f"pooling-{base}", int(time.time()), model, outputs, tokens)
    else:
        answer = V.embedding_response(f"embd-{base}", int(time.time()), model, outputs, tokens)
    return json_response(answer)


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "embeddings")


async def pooling(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "pooling")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/pooling", pooling)
