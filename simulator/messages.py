"""The Anthropic Messages API of a replica, as vLLM 0.32 serves it: POST /v1/messages
(streamed or not) and /v1/messages/count_tokens, both over the chat path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from simulator import generation as G
from simulator import protocol as P
from simulator.config import SimError
from simulator.http_util import JSON, api_error_response, replica_of
from vllm_api import anthropic as A
from vllm_api.errors import VllmApiError, error_type
from vllm_api.named_sse import frame

if TYPE_CHECKING:
    from simulator.replica import Replica

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_ROLES = ("user", "assistant", "system")
_ROLES_MSG = "Input should be 'user', 'assistant' or 'system'"
# Claude Code's attribution header: vLLM drops it from system text (it defeats caching).


class _HandlerError(Exception):
    """An error vLLM's Messages handler answers in Anthropic's shape (not pydantic's)."""

    def __init__(self, status: int, message: str, err_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type or error_type(status)


def _anthropic(status: int, message: str, err_type: str | None = None) -> web.Response:
    body = A.error_body(err_type or error_type(status), message)
    return web.Response(body=body, status=status, content_type=JSON)


@dataclass(frozen=True, slots=True)
class _Request:
    model: str
    messages: list[dict[str, Any]]  # as OpenAI chat messages
    max_tokens: int | None
    stream: bool
    stops: tuple[str, ...]


def _parse(body: dict[str, Any], *, generate: bool) -> _Request:
    """pydantic's validation of AnthropicMessagesRequest: every failing field, in order."""
    errors: list[dict[str, Any]] = []
    model = body.get("model")
    if model is None:
        errors.append(P.field_error("missing", "model", "Field required", body))
    msgs = body.get("messages")
    if msgs is None:
        errors.append(P.field_error("missing", "messages", "Field required", body))
    elif not isinstance(msgs, list):
        errors.append(P.field_error("list_type", "messages", "Input should be a valid list", msgs))
    else:
        for i, m in enumerate(msgs):
            role = m.get("role") if isinstance(m, dict) else None
            if role not in _ROLES:
                errors.append(P.field_error("literal_error", f"messages.{i}.role", _ROLES_MSG,
                              role, expected="'user', 'assistant' or 'system'"))  # fmt: skip
            elif not isinstance(m.get("content"), str | list):
                errors.append(P.field_error("string_type", f"messages.{i}.content",
                              "Input should be a valid string", m.get("content")))  # fmt: skip
    k = body.get("max_tokens")
    if generate:
        if k is None:
            errors.append(P.field_error("missing", "max_tokens", "Field required", body))
        elif not isinstance(k, int) or isinstance(k, bool):
            errors.append(P.field_error("int_type", "max_tokens",
                          "Input should be a valid integer", k))  # fmt: skip
        elif k <= 0:
            errors.append(P.field_error(
                "value_error", "max_tokens", "Value error, max_tokens must be positive", k,
                error=_Repr("ValueError('max_tokens must be positive')"),
            ))  # fmt: skip
    if errors:
        raise P.validation_errors(errors)
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise P.validation_errors([P.field_error("list_type", "stop_sequences",
                                  "Input should be a valid list", stops)])  # fmt: skip
    stream = P.lax_bool(body, "stream", False) if generate else False
    return _Request(str(model), A.chat_messages(body), k if generate else None, stream,
                    tuple(s for s in stops if s))  # fmt: skip


class _Repr(str):
    """A str shown unquoted in an error dict, as pydantic's ctx shows the exception."""

    def __repr__(self) -> str:
        return str(self)


def _prompt(rep: Replica, rq: _Request) -> tuple[list[int], int]:
    """The chat path's checks and prompt (vLLM hands the converted request to chat)."""
    if rq.model not in rep.served:
        raise _HandlerError(404, f"The model `{rq.model}` does not exist. Valid aliases: "
                            f"{rep.served[0]}.")  # fmt: skip
    max_len = rep.config.max_model_len
    k = rq.max_tokens
    if k is not None and k > max_len:
        raise _HandlerError(400, f"max_completion_tokens={k} cannot be greater than "
                            f"max_model_len={max_len}. Please request fewer output tokens. "
                            f"(parameter=max_completion_tokens, value={k})")  # fmt: skip
    if not rq.messages:
        raise _HandlerError(400, P.EMPTY_CHAT)
    try:
        text = rep.template.render(rq.messages)
        P.check_text_length(len(text), max_len, rep.max_chars_per_token)
        ids = rep.encode_prompt(text, chat=True)
        return ids, P.check_length(len(ids), k, max_len, from_text=True)
    except P.ApiError as exc:
        raise _HandlerError(exc.status, exc.message, exc.err_type) from exc
    except (SimError, VllmApiError) as exc:
        raise _HandlerError(400, str(exc)) from exc


def _usage(rep: Replica, c: G.Choice) -> dict[str, Any]:
    u = G.usage(rep, c)
    details = rep.config.enable_prompt_tokens_details
    return A.usage(u.prompt, u.completion, u.cached if details else None,
                   u.created if details else None)  # fmt: skip


async def create(request: web.Request) -> web.StreamResponse:
    rep = replica_of(request)
    if (early := await G.early_answer(request, rep, _anthropic)) is not None:
        return early
    try:
        body = P.parse_body(await request.read())
        rq = _parse(body, generate=True)
        ids, max_tokens = _prompt(rep, rq)
    except P.ApiError as exc:
        return api_error_response(exc)
    except _HandlerError as exc:
        return _anthropic(exc.status, exc.message, exc.err_type)
    no_room = G.kv_refusal(rep, len(ids))
    if no_room is not None:
        return _anthropic(no_room.status, no_room.message)
    mid = rep.new_request_id(request.headers.get("X-Request-Id"), chat=True)
    priority, salt = G.scheduling(body)
    req = G.new_request(rep, ids, model=rq.model, request_id=mid, max_tokens=max_tokens,
                        priority=priority, cache_salt=salt)  # fmt: skip
    async with G.running(rep, req) as c:
        if rq.stream:
            return await _stream(request, rep, rq, mid, c)
        try:
            text = await G.complete(rep, c, rq.stops)
        except G.EngineFailure as err:
            return G.reset(request) if err.kind == "restart" else _anthropic(500, str(err))
        reason, seq = A.stop_reason(c.finish or c.req.finish_reason, c.stop_reason)
        out: dict[str, Any] = {"id": mid, "type": "message", "role": "assistant",
                               "content": [{"type": "text", "text": text}], "model": rq.model,
                               "stop_reason": reason}  # fmt: skip
        if seq is not None:
            out["stop_sequence"] = seq  # the body is dumped without its None fields
        out["usage"] = _usage(rep, c)
        return web.Response(body=orjson.dumps(out), content_type=JSON)


def _event(name: str, body: dict[str, Any]) -> bytes:
    return frame(name, orjson.dumps({"type": name, **body}))


async def _stream(
    request: web.Request, rep: Replica, rq: _Request, mid: str, c: G.Choice
) -> web.StreamResponse:
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    await resp.prepare(request)
    # The first chat chunk's usage: the whole prompt, nothing generated, no cache details.
    start: dict[str, Any] = {"id": mid, "type": "message", "role": "assistant", "content": [],
             "model": rq.model, "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": len(c.req.prompt_ids), "output_tokens": 0}}  # fmt: skip
    await resp.write(_event("message_start", {"message": start}))
    opened = False
    try:
        async for piece in G.pieces(request, rep, c, rq.stops):
            if not piece:
                continue
            head = b""
            if not opened:
                block = {"content_block": {"type": "text", "text": ""}, "index": 0}
                head = _event("content_block_start", block)
                opened = True
            delta = {"delta": {"type": "text_delta", "text": piece}, "index": 0}
            await resp.write(head + _event("content_block_delta", delta))
    except G.StreamCut:
        return resp
    except G.EngineFailure as err:
        await resp.write(A.stream_error_event(str(err)))
        return resp
    reason, seq = A.stop_reason(c.finish, c.stop_reason)
    tail = _event("content_block_stop", {"index": 0}) if opened else b""
    tail += _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                     "usage": _usage(rep, c)})  # fmt: skip
    await resp.write(tail + _event("message_stop", {}))
    await resp.write_eof()
    return resp


async def count_tokens(request: web.Request) -> web.Response:
    rep = replica_of(request)
    try:
        rq = _parse(P.parse_body(await request.read()), generate=False)
        ids, _ = _prompt(rep, rq)
    except P.ApiError as exc:
        return api_error_response(exc)
    except _HandlerError as exc:
        return _anthropic(exc.status, exc.message, exc.err_type)
    n = len(ids)
    body = {"input_tokens": n, "context_management": {"original_input_tokens": n}}
    return web.Response(body=orjson.dumps(body), content_type=JSON)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", create)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
