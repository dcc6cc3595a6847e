"""The OpenAI Responses API of a replica, as vLLM 0.32 serves it: POST /v1/responses (streamed
or not, stored, background, previous_response_id), GET and cancel of a stored response."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from simulator import generation as G
from simulator import protocol as P
from simulator.config import SimError
from simulator.engine import EngineRequest
from simulator.http_util import JSON, REPLICA, api_error_response, error_response, replica_of
from vllm_api import responses as R
from vllm_api.errors import VllmApiError

if TYPE_CHECKING:
    from simulator.replica import Replica

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_NO_STORE_BACKGROUND = (
    "This vLLM engine does not support `store=True` and therefore does not support the "
    "background mode. To enable these features, set the environment variable "
    "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."
)
# Request fields the response object echoes as sent (None when absent).
_ECHO = ("instructions", "metadata", "max_tool_calls", "previous_response_id", "prompt",
         "reasoning", "text", "user")  # fmt: skip


@dataclass(slots=True)
class _Stored:
    response: dict[str, Any]
    messages: list[dict[str, Any]]  # the chat messages its prompt was rendered from


class ResponseStore:
    """A replica's stored responses, oldest dropped beyond ``size``; background tasks."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[str, _Stored] = OrderedDict()
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def get(self, rid: str) -> _Stored | None:
        return self._items.get(rid)

    def put(self, rid: str, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        old = self._items.get(rid)
        if old is not None and old.response["status"] == "cancelled":
            return  # vLLM keeps a cancelled response as cancelled
        self._items[rid] = _Stored(response, messages)
        self._items.move_to_end(rid)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    async def close(self, _app: web.Application) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=5.0)


STORE: web.AppKey[ResponseStore] = web.AppKey("sim_responses")


@dataclass(frozen=True, slots=True)
class _Request:
    body: dict[str, Any]
    model: str
    input: list[dict[str, Any]]  # the new input as chat messages
    max_output_tokens: int | None
    stream: bool
    store: bool
    background: bool


def _text_of(content: Any) -> str | None:
    """A message's content as the chat template sees it: text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        kinds = ("input_text", "output_text", "text")
        texts = [str(p.get("text", "")) for p in content
                 if isinstance(p, dict) and p.get("type") in kinds]  # fmt: skip
        return "\n".join(texts)
    return None


def _parse(body: dict[str, Any], default_model: str) -> _Request:
    if P.lax_bool(body, "background", False) and not P.lax_bool(body, "store", True):
        raise P.bad_request("background can only be used when `store` is true", "background")
    if not body.get("tools"):
        # vLLM's check_tool_usage sets tool_choice in the body it validates (pydantic's
        # errors then count it among the body's items).
        choice = body.get("tool_choice", "auto")
        if choice == "required":
            raise P.bad_request(
                "Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice"
            )
        if choice in ("auto", "none"):
            body = {**body, "tool_choice": "none"}
    if "input" not in body:
        raise P.missing_field("input", body)
    raw = body["input"]
    if isinstance(raw, str):
        msgs = [{"role": "user", "content": raw}]
    elif isinstance(raw, list):
        msgs = []
        for item in raw:
            if not isinstance(item, dict) or not isinstance(item.get("role"), str):
                raise P.invalid("input items must be messages with a role", "body.input")
            text = _text_of(item.get("content"))
            if text is None:
                raise P.invalid("message content must be a string or a list", "body.input")
            msgs.append({"role": item["role"], "content": text})
    else:
        raise P.validation_errors([
            P.field_error("string_type", "input", "Input should be a valid string", raw),
            P.field_error("list_type", "input", "Input should be a valid list", raw),
        ])  # fmt: skip
    model = body.get("model") or default_model
    k = body.get("max_output_tokens")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool)):
        raise P.invalid("max_output_tokens must be an integer", "body.max_output_tokens")
    store = P.lax_bool(body, "store", True)
    background = P.lax_bool(body, "background", False)
    return _Request(body, str(model), msgs, k, P.lax_bool(body, "stream", False), store,
                    background)  # fmt: skip


def _not_found(rid: str) -> web.Response:
    body = P.ApiError(404, f"Response with id '{rid}' not found.", "invalid_request_error",
                      "response_id").body()  # fmt: skip
    return web.Response(body=body, status=404, content_type=JSON)


def _response(
    rq: _Request,
    rid: str,
    created: int,
    *,
    status: str,
    max_tokens: int,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """The response object in vLLM's field order (ResponsesResponse.from_request)."""
    b = rq.body
    echo = {k: b.get(k) for k in _ECHO}
    tools = b.get("tools") or []
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": rid, "created_at": created, "incomplete_details": incomplete,
        "instructions": echo["instructions"], "metadata": echo["metadata"], "model": rq.model,
        "object": "response", "output": output,
        "parallel_tool_calls": b.get("parallel_tool_calls", True) is not False,
        "temperature": _number(b, "temperature"),
        "tool_choice": b.get("tool_choice") or ("auto" if tools else "none"), "tools": tools,
        "top_p": _number(b, "top_p"),
        "background": rq.background, "max_output_tokens": max_tokens,
        "max_tool_calls": echo["max_tool_calls"],
        "previous_response_id": echo["previous_response_id"], "prompt": echo["prompt"],
        "reasoning": echo["reasoning"], "service_tier": b.get("service_tier") or "auto",
        "status": status, "text": echo["text"], "top_logprobs": None,
        "truncation": b.get("truncation") or "disabled", "usage": usage, "user": echo["user"],
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "kv_transfer_params": None,
        "ec_transfer_params": None, "input_messages": None, "output_messages": None,
    }  # fmt: skip


def _number(body: dict[str, Any], key: str) -> float:
    """A sampling parameter as the response reports it: sent, else vLLM's default 1.0."""
    v = body.get(key)
    return float(v) if isinstance(v, int | float) else 1.0


def _messages(rq: _Request, prev: _Stored | None) -> list[dict[str, Any]]:
    """vLLM's construct_input_messages: instructions, the previous turn's messages (their
    instructions dropped) and output, then the new input."""
    out: list[dict[str, Any]] = []
    instructions = rq.body.get("instructions")
    if instructions:
        out.append({"role": "system", "content": str(instructions)})
    if prev is not None:
        out += [m for m in prev.messages if m.get("role") != "system"]
        for item in prev.response["output"]:
            out += [{"role": "assistant", "content": part["text"]} for part in item["content"]]
    return out + rq.input


def _prompt(rep: Replica, rq: _Request, msgs: list[dict[str, Any]]) -> tuple[list[int], int]:
    """Prompt ids and effective max tokens, with vLLM's checks in vLLM's order."""
    max_len = rep.config.max_model_len
    k = rq.max_output_tokens
    if k is not None and k > max_len:
        raise P.bad_request(
            f"max_output_tokens={k} cannot be greater than max_model_len={max_len}. "
            "Please request fewer output tokens.",
            "max_output_tokens",
            k,
        )
    if not msgs:
        raise P.ApiError(400, P.EMPTY_CHAT, "BadRequestError")
    text = rep.template.render(msgs)
    P.check_text_length(len(text), max_len, rep.max_chars_per_token)
    # The Responses renderer tokenizes with special tokens: a BOS before the template's own.
    ids = rep.encode_prompt(text, chat=False)
    if len(ids) == max_len:
        raise P.ApiError(
            400, f"The engine prompt length {len(ids)} exceeds the max_model_len {max_len}. "
            "Please reduce prompt.", "invalid_request_error", "input",
        )  # fmt: skip
    return ids, P.check_length(len(ids), k, max_len, from_text=True)


def _usage(rep: Replica, c: G.Choice) -> dict[str, Any]:
    u = G.usage(rep, c)
    return R.usage_body(u.prompt, u.cached or 0, u.created, u.completion)


async def create(request: web.Request) -> web.StreamResponse:
    rep = replica_of(request)
    store = request.app[STORE]
    if (early := await G.early_answer(request, rep)) is not None:
        return early
    try:
        rq = _parse(P.parse_body(await request.read()), rep.served[0])
        if rq.model not in rep.served:
            raise P.ApiError(404, f"The model `{rq.model}` does not exist. Valid aliases: "
                             f"{rep.served[0]}.", "NotFoundError", "model")  # fmt: skip
        if rq.store and not rep.config.responses_store:
            if rq.background:
                raise P.ApiError(400, _NO_STORE_BACKGROUND, "invalid_request_error", "background")
            rq = _Request(rq.body, rq.model, rq.input, rq.max_output_tokens, rq.stream, False,
                          False)  # fmt: skip
        prev_id = rq.body.get("previous_response_id")
        prev = None
        if prev_id is not None:
            prev = store.get(str(prev_id))
            if prev is None:
                return _not_found(str(prev_id))
        msgs = _messages(rq, prev)
        ids, max_tokens = _prompt(rep, rq, msgs)
    except P.ApiError as exc:
        return api_error_response(exc)
    except (SimError, VllmApiError) as exc:  # e.g. a chat template that raised
        return error_response(400, str(exc))
    no_room = G.kv_refusal(rep, len(ids))
    if no_room is not None:
        return error_response(no_room.status, no_room.message)
    rid = f"resp_{uuid.uuid4().hex[:16]}"
    created = int(time.time())
    priority, salt = G.scheduling(rq.body)
    req = G.new_request(rep, ids, model=rq.model, request_id=rid, max_tokens=max_tokens,
                        priority=priority, cache_salt=salt,
                        ignore_eos=rq.body.get("ignore_eos") is True)  # fmt: skip
    turn = _Turn(rep, store, rq, rid, created, max_tokens, msgs)
    if rq.background and not rq.stream:
        queued = turn.snapshot("queued")
        store.put(rid, queued, msgs)
        task = asyncio.create_task(turn.background(req), name=f"sim-{rid}")
        store.tasks[rid] = task
        task.add_done_callback(lambda _t: store.tasks.pop(rid, None))
        return web.Response(body=orjson.dumps(queued), content_type=JSON)
    async with G.running(rep, req) as c:
        if rq.stream:
            return await turn.stream(request, c)
        try:
            text = await G.complete(rep, c)
        except G.EngineFailure as err:
            return G.reset(request) if err.kind == "restart" else error_response(500, str(err))
        return web.Response(body=orjson.dumps(turn.finished(c, text)), content_type=JSON)


@dataclass(slots=True)
class _Turn:
    """One response being generated: its snapshots, its stream and its storing."""

    rep: Replica
    store: ResponseStore
    rq: _Request
    rid: str
    created: int
    max_tokens: int
    msgs: list[dict[str, Any]]

    def snapshot(self, status: str) -> dict[str, Any]:
        return _response(self.rq, self.rid, self.created, status=status,
                         max_tokens=self.max_tokens, output=[], usage=None)  # fmt: skip

    def finished(self, c: G.Choice, text: str, item_id: str | None = None) -> dict[str, Any]:
        """The final response (stored when asked): vLLM leaves out an item's empty text."""
        item = R.message_item(item_id or f"msg_{uuid.uuid4().hex[:16]}", text or None,
                              "completed")  # fmt: skip
        status = "incomplete" if c.finish == "length" else "completed"
        final = _response(self.rq, self.rid, self.created, status=status,
                          max_tokens=self.max_tokens, output=[item],
                          usage=_usage(self.rep, c))  # fmt: skip
        if self.rq.store:
            self.store.put(self.rid, final, self.msgs)
        return final

    async def background(self, req: EngineRequest) -> None:
        async with G.running(self.rep, req) as c:
            try:
                text = await G.complete(self.rep, c)
            except G.EngineFailure:
                stored = self.store.get(self.rid)
                if stored is not None and stored.response["status"] not in R.FINAL_STATUSES:
                    stored.response["status"] = "failed"
                return
            self.finished(c, text)

    async def stream(self, request: web.Request, c: G.Choice) -> web.StreamResponse:
        ev = R.StreamEvents(f"msg_{uuid.uuid4().hex[:16]}")
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        head = self.snapshot("in_progress")
        await resp.write(ev.response("response.created", head)
                         + ev.response("response.in_progress", head))  # fmt: skip
        parts: list[str] = []
        try:
            async for piece in G.pieces(request, self.rep, c):
                if piece:
                    opened = ev.opened() if not parts else b""
                    parts.append(piece)
                    await resp.write(opened + ev.delta(piece))
        except G.StreamCut:
            return resp
        except G.EngineFailure as err:
            await resp.write(ev.error(str(err)))
            return resp
        text = "".join(parts)
        final = self.finished(c, text, ev.item_id)
        if not parts:
            final["output"] = []  # nothing streamed, no item: vLLM reports none
        tail = ev.closed(text) if parts else b""
        await resp.write(tail + ev.response("response.completed", final))
        await resp.write_eof()
        return resp


async def retrieve(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    stored = request.app[STORE].get(rid)
    if stored is None:
        return _not_found(rid)
    return web.Response(body=orjson.dumps(stored.response), content_type=JSON)


async def cancel(request: web.Request) -> web.Response:
    store = request.app[STORE]
    rid = request.match_info["response_id"]
    stored = store.get(rid)
    if stored is None:
        return _not_found(rid)
    if stored.response["status"] not in ("queued", "in_progress"):
        err = P.ApiError(400, "Cannot cancel a synchronous response.", "invalid_request_error",
                         "response_id")  # fmt: skip
        return api_error_response(err)
    stored.response["status"] = "cancelled"
    task = store.tasks.get(rid)
    if task is not None:
        task.cancel()  # leaving G.running aborts the engine request
        await asyncio.wait([task], timeout=5.0)
    return web.Response(body=orjson.dumps(stored.response), content_type=JSON)


def add_routes(app: web.Application) -> None:
    store = ResponseStore(app[REPLICA].config.responses_store_size)
    app[STORE] = store
    app.on_cleanup.append(store.close)
    app.router.add_post("/v1/responses", create)
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel)
