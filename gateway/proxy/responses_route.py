"""OpenAI Responses through the gateway: the prompt vLLM renders, stored responses' replicas."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson

from gateway.errors import GatewayError
from gateway.proxy.requests import Kind, ParsedRequest
from vllm_api.errors import error_body
from vllm_api.named_sse import NamedSseParser
from vllm_api.sse import SseError

# `response.created` comes first; it echoes `instructions`, so it may be as large as a body.
_SNIFF_LIMIT = 8 * 1024 * 1024


class ResponseNotFound(GatewayError):
    """No replica is known to store this response: vLLM's own 404 for an unknown id."""

    status = 404

    def __init__(self, response_id: str) -> None:
        super().__init__(f"Response with id '{response_id}' not found.", param="response_id")

    @property
    def error_type(self) -> str:
        return "invalid_request_error"

    def body(self) -> bytes:
        """vLLM's own body for it (_make_not_found_error), not the one its status implies."""
        return error_body(self.message, self.status, self.param, err_type=self.error_type)


class ResponseReplicaGone(GatewayError):
    """The replica that stored the response left the fleet: the response is lost with it."""

    status = 410

    def __init__(self, response_id: str, replica: str) -> None:
        super().__init__(
            f"Response with id '{response_id}' was stored by replica `{replica}`, which is no "
            "longer serving: the response is lost. Start a new conversation without "
            "previous_response_id.",
            param="response_id",
        )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        kinds = ("input_text", "output_text", "text")
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") in kinds
        )
    raise ValueError("message content must be a string or a list")


def chat_messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's construct_input_messages for a first turn (as simulator/responses.py)."""
    out: list[dict[str, Any]] = []
    instructions = data.get("instructions")
    if instructions:
        out.append({"role": "system", "content": str(instructions)})
    raw = data["input"]
    if isinstance(raw, str):
        return [*out, {"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise ValueError("input must be a string or a list")
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            raise ValueError("input items must be messages with a role")
        out.append({"role": item["role"], "content": _text_of(item.get("content"))})
    return out


def body_id(body: bytes) -> str | None:
    """The `id` of a non-streamed response object."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    rid = data.get("id") if isinstance(data, dict) else None
    return rid if isinstance(rid, str) and rid else None


class CreatedSniffer:
    """Finds the response id in a stream's `response.created` event as chunks go by."""

    __slots__ = ("_parser", "_seen", "done")

    def __init__(self) -> None:
        self._parser = NamedSseParser(_SNIFF_LIMIT)
        self._seen = 0
        self.done = False

    def feed(self, chunk: bytes) -> str | None:
        """The id once its event is complete in what was fed; None until then (or never)."""
        if self.done:
            return None
        self._seen += len(chunk)
        try:
            events = self._parser.feed(chunk)
        except SseError:
            events = []
            self.done = True
        for event in events:
            self.done = True
            if event.name != "response.created":
                return None  # vLLM sends it first: a stream without it names no response
            try:
                data = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                return None
            response = data.get("response") if isinstance(data, dict) else None
            rid = response.get("id") if isinstance(response, dict) else None
            return rid if isinstance(rid, str) and rid else None
        if self._seen > _SNIFF_LIMIT:
            self.done = True
        return None


def stored_path(req: ParsedRequest) -> str | None:
    """The replica's path for a stored response's GET or cancel; None for any other route."""
    rid = quote(req.response_id or "", safe="")
    if req.kind == "response_cancel":
        return f"/v1/responses/{rid}/cancel"
    if req.kind == "response_get":
        return f"/v1/responses/{rid}" + (f"?{req.query}" if req.query else "")
    return None


_PREFIX = "/v1/responses/"


def stored_route(method: str, path: str) -> tuple[Kind, str] | None:
    """(kind, response id) of `POST /v1/responses/{id}/cancel` or `GET /v1/responses/{id}`."""
    if not path.startswith(_PREFIX):
        return None
    rest = path[len(_PREFIX) :]
    if method == "POST" and rest.endswith("/cancel"):
        rid = rest[: -len("/cancel")]
        kind: Kind = "response_cancel"
    elif method == "GET":
        rid, kind = rest, "response_get"
    else:
        return None
    if not rid or "/" in rid:
        return None
    return kind, rid
