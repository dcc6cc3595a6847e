"""vLLM's OpenAI-compatible request parsing and response bodies (bytes, orjson)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from vllm_api.errors import error_body


class ApiError(Exception):
    """An error answered with vLLM's error body: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> bytes:
        return error_body(self.message, self.status, self.param, err_type=self.err_type)


def bad_request(message: str, param: str | None = None, value: object = None) -> ApiError:
    """A VLLMValidationError: str() of it appends "(parameter=..., value=...)" when set."""
    extras = [f"{k}={v}" for k, v in (("parameter", param), ("value", value)) if v is not None]
    if extras:
        message = f"{message} ({', '.join(extras)})"
    return ApiError(400, message, "BadRequestError", param)


def invalid(message: str, param: str | None = None) -> ApiError:
    """A pydantic/FastAPI RequestValidationError: vLLM's handler types it with the phrase."""
    return ApiError(400, message, "Bad Request", param)


def missing_field(name: str, body: dict[str, Any]) -> ApiError:
    """A required body field absent: vLLM renders pydantic's error dict, input summarised."""
    error = {"type": "missing", "loc": f"body.{name}", "msg": "Field required",
             "input": f"<dict of {len(body)} items>"}  # fmt: skip
    return invalid(f"1 validation error:\n  {error}", f"body.{name}")


def summarise(value: object) -> str:
    """pydantic's ``input`` of an error as vLLM renders it: containers by size, else str()."""
    if isinstance(value, dict):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list):
        return f"<list of {len(value)} items>"
    return str(value)


def validation_errors(errors: list[dict[str, Any]]) -> ApiError:
    """Several pydantic errors in one RequestValidationError, as vLLM renders them."""
    n = len(errors)
    lines = "".join(f"\n  {e}" for e in errors)
    return invalid(f"{n} validation error{'s' if n != 1 else ''}:{lines}", errors[0]["loc"])


def field_error(kind: str, name: str, msg: str, value: object, **ctx: Any) -> dict[str, Any]:
    """One pydantic error dict about body field ``name`` (ctx only when pydantic sets one)."""
    error: dict[str, Any] = {"type": kind, "loc": f"body.{name}", "msg": msg,
                             "input": summarise(value)}  # fmt: skip
    if ctx:
        error["ctx"] = ctx
    return error


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def lax_bool(body: dict[str, Any], key: str, default: bool) -> bool:
    """A bool field as pydantic's lax mode reads it ("yes", 1 and "true" are all True)."""
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in _TRUE | _FALSE:
        return v.lower() in _TRUE
    raise validation_errors(
        [field_error("bool_parsing", key, "Input should be a valid boolean", v)]
    )


EMPTY_CHAT = "Cannot apply chat template to an empty conversation. Provide at least one message."
_EMPTY_CHAT = EMPTY_CHAT


@dataclass(frozen=True, slots=True)
class GenRequest:
    """The fields of a completion or chat request the simulator acts on."""

    model: str
    prompt: str | None
    prompt_ids: list[int] | None
    messages: list[dict[str, Any]] | None
    max_tokens: int | None
    max_tokens_param: str  # the field max_tokens came from: named in vLLM's messages
    n: int
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    ignore_eos: bool
    priority: int
    cache_salt: str | None


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"JSON decode error: {exc}") from exc
    if not isinstance(body, dict):
        raise invalid("Input should be a valid dictionary or object to extract fields from")
    return body


def _int(body: dict[str, Any], key: str, default: int | None, minimum: int) -> int | None:
    v = body.get(key, default)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise invalid(f"{key} must be an integer")
    if v < minimum:
        raise bad_request(f"{key} must be at least {minimum}, got {v}.", key, v)
    return v


def parse_gen(body: dict[str, Any], *, chat: bool, default_model: str) -> GenRequest:
    """Validate the fields vLLM validates; everything else is accepted and ignored."""
    model = body.get("model") or default_model
    if not isinstance(model, str):
        raise invalid("model must be a string")
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    if chat:
        msgs = body.get("messages")
        if msgs is None:
            raise missing_field("messages", body)
        if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
            raise invalid("messages must be a list of message objects", "body.messages")
        if not msgs:
            raise ApiError(400, _EMPTY_CHAT, "BadRequestError")
        messages = msgs
        param = "max_completion_tokens"
        max_tokens = _int(body, param, None, 1)
        if max_tokens is None:
            param = "max_tokens"
            max_tokens = _int(body, param, None, 1)
    else:
        p = body.get("prompt")
        if p is None or p == "":
            # CompletionRequest's model validator raises a VLLMValidationError, which vLLM's
            # handler answers as itself, not as FastAPI's "Bad Request".
            raise bad_request(
                "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
            )
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str | list):
            p = p[0]  # a batch of one prompt
        if isinstance(p, str):
            prompt = p  # [""] is a batch of one empty prompt: vLLM accepts it
        elif isinstance(p, list) and p and all(isinstance(t, int) and t >= 0 for t in p):
            prompt_ids = list(p)
        elif p == []:
            raise ApiError(400, "You must pass at least one prompt", "BadRequestError")
        else:
            raise invalid("prompt must be a string, a list of token ids, or a batch of one")
        param = "max_tokens"
        max_tokens = _int(body, param, 16, 1)
    n = _int(body, "n", 1, 1) or 1
    stream = body.get("stream") is True
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise invalid("stream_options must be an object")
    if opts and not stream:
        raise invalid("Stream options can only be defined when `stream=True`.")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(s for s in stop if s)
    else:
        raise invalid("stop must be a string or a list of strings")
    priority = _int(body, "priority", 0, -(2**31))
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise invalid("Parameter 'cache_salt' must be a non-empty string if provided.")
    return GenRequest(
        model=model,
        prompt=prompt,
        prompt_ids=prompt_ids,
        messages=messages,
        max_tokens=max_tokens,
        max_tokens_param=param,
        n=n,
        stream=stream,
        include_usage=bool(opts and opts.get("include_usage")),
        stop=stops,
        ignore_eos=body.get("ignore_eos") is True,
        priority=priority or 0,
        cache_salt=salt,
    )


def check_max_tokens(gen: GenRequest, max_model_len: int) -> None:
    """vLLM's TokenizeParams check, made before the prompt is tokenized."""
    k = gen.max_tokens
    if k is not None and k > max_model_len:
        raise bad_request(
            f"{gen.max_tokens_param}={k} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            gen.max_tokens_param,
            k,
        )


def check_text_length(chars: int, max_model_len: int, max_chars_per_token: int | None) -> None:
    """vLLM's character pre-check of prompt text: no token can be longer than the longest
    vocabulary entry, so longer text cannot fit. Skipped when the vocabulary is open-ended."""
    if max_chars_per_token is None:
        return
    limit = max_model_len * max_chars_per_token
    if chars > limit:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {chars} characters (more than {limit} characters, which is the "
            f"upper bound for {max_model_len} input tokens). Please reduce the length of the "
            "input prompt.",
            "input_text",
            chars,
        )


def check_length(
    prompt_len: int, max_tokens: int | None, max_model_len: int, *, from_text: bool
) -> int:
    """vLLM's prompt-length check; returns the effective max_tokens (clamped to the context).

    vLLM tokenizes text with truncation at max_model_len + 1, so a long text prompt counts as
    "at least" that; token ids are counted in full (the qualifier still shows at exactly +1).
    """
    over = max_model_len + 1
    count = min(prompt_len, over) if from_text else prompt_len
    if count > max_model_len:
        qualifier = "at least " if count == over else ""
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {qualifier}{count} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
            count,
        )
    room = max_model_len - prompt_len
    effective = room if max_tokens is None else min(room, max_tokens)
    if effective < 1:
        # A prompt of exactly max_model_len leaves 0 tokens; SamplingParams refuses that.
        raise bad_request(f"max_tokens must be at least 1, got {effective}.", "max_tokens", 0)
    return effective


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one answer; ``cached`` is None when prompt-token details are off."""

    prompt: int
    completion: int
    cached: int | None
    created: int = 0  # prompt tokens this request wrote to the prefix cache


def usage_body(u: Usage, *, chat: bool, stream: bool) -> dict[str, Any]:
    """``usage`` as vLLM 0.32 dumps it: each route builds and serialises it its own way.

    Non-streamed bodies dump every field (None included); the streamed completion usage chunk
    is dumped with exclude_unset (only cached_tokens was set), streamed chat with exclude_none.
    Completions never report created_cache_tokens; chat does.
    """
    out: dict[str, Any] = {
        "prompt_tokens": u.prompt,
        "total_tokens": u.prompt + u.completion,
        "completion_tokens": u.completion,
    }
    details: dict[str, Any] | None = None
    if u.cached is not None:
        details = {"cached_tokens": u.cached}
        if chat:
            details["created_cache_tokens"] = u.created
        if not stream:
            details.setdefault("created_cache_tokens", None)
            details["multimodal_tokens"] = None
    if not stream:
        out["prompt_tokens_details"] = details
        out["completion_tokens_details"] = None
    elif details is not None:
        out["prompt_tokens_details"] = details
    return out


@dataclass(frozen=True, slots=True)
class Choice:
    """One finished choice of a non-streamed answer."""

    index: int
    text: str
    finish_reason: str
    stop_reason: str | None


class StreamFrames:
    """Pre-rendered SSE frame pieces of one stream: a chunk costs a few concatenations."""

    def __init__(self, req_id: str, created: int, model: str, chat: bool) -> None:
        self.chat = chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._top = {"id": req_id, "object": obj, "created": created, "model": model}
        self._head = b"data: " + orjson.dumps(self._top)[:-1] + b',"choices":[{"index":'
        if chat:
            self._mid = b',"delta":{"content":'
            self._tail = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self._mid = b',"text":'
            self._tail = (
                b',"logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}\n\n'
            )

    def role(self, index: int = 0) -> bytes:
        choice = {"index": index, "delta": {"role": "assistant", "content": ""},
                  "logprobs": None, "finish_reason": None}  # fmt: skip
        return b"data: " + orjson.dumps({**self._top, "choices": [choice]}) + b"\n\n"

    def chunk(self, text: str, index: int = 0) -> bytes:
        return self._head + str(index).encode() + self._mid + orjson.dumps(text) + self._tail

    def final(
        self, text: str, finish_reason: str, stop_reason: str | None, index: int = 0
    ) -> bytes:
        if self.chat:
            choice: dict[str, Any] = {
                "index": index,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
            return b"data: " + orjson.dumps({**self._top, "choices": [choice]}) + b"\n\n"
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": stop_reason}  # fmt: skip
        body = {**self._top, "choices": [choice], "usage": None}
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def usage(self, u: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps({**self._top, "choices": [], "usage": u}) + b"\n\n"


def completion_body(
    req_id: str, created: int, model: str, choices: list[Choice], u: dict[str, Any]
) -> bytes:
    out = [{"index": c.index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason, "prompt_logprobs": None} for c in choices]  # fmt: skip
    return orjson.dumps({"id": req_id, "object": "text_completion", "created": created,
                         "model": model, "choices": out, "usage": u,
                         "kv_transfer_params": None})  # fmt: skip


def chat_body(
    req_id: str, created: int, model: str, choices: list[Choice], u: dict[str, Any]
) -> bytes:
    out: list[dict[str, Any]] = [
        {
            "index": c.index,
            "message": {"role": "assistant", "reasoning_content": None, "content": c.text,
                        "tool_calls": []},
            "logprobs": None,
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }
        for c in choices
    ]  # fmt: skip
    return orjson.dumps({"id": req_id, "object": "chat.completion", "created": created,
                         "model": model, "choices": out, "usage": u,
                         "prompt_logprobs": None, "kv_transfer_params": None})  # fmt: skip
