"""Parse an OpenAI request body once and extract what routing needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.errors import BadRequest
from routing.types import RequestFeatures

Kind = Literal["chat", "completions"]


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """One validated client request; `body` is forwarded upstream exactly as received."""

    kind: Kind
    body: bytes
    data: dict[str, Any]
    model: str
    stream: bool
    request_id: str
    features: RequestFeatures


def _estimate_prompt_chars(kind: Kind, data: dict[str, Any]) -> int:
    if kind == "chat":
        total = 0
        for m in data["messages"]:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        total += len(part["text"])
        return total
    prompt = data["prompt"]
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return 4 * len(prompt)  # token ids: count them at ~4 characters each
    if isinstance(prompt, list):
        return sum(len(p) if isinstance(p, str) else 4 * len(p) for p in prompt)
    return 0


def parse_request(
    kind: Kind, body: bytes, request_id: str, session: str | None = None
) -> ParsedRequest:
    """Validate the fields the gateway relies on; the replica validates the rest."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"Invalid JSON in request body: {exc.msg}") from None
    if not isinstance(data, dict):
        raise BadRequest("The request body must be a JSON object.")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("`model` is required and must be a non-empty string.", param="model")
    if kind == "chat":
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("`messages` must be a non-empty array.", param="messages")
    elif "prompt" not in data or data["prompt"] in (None, "", []):
        raise BadRequest("`prompt` is required.", param="prompt")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("`stream` must be a boolean.", param="stream")
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise BadRequest("`max_tokens` must be a positive integer.", param="max_tokens")
    priority = data.get("priority", 0)
    if not isinstance(priority, int):
        raise BadRequest("`priority` must be an integer.", param="priority")
    user = data.get("user")
    prompt_tokens = _estimate_prompt_chars(kind, data) // 4
    features = RequestFeatures(
        model=model,
        request_id=request_id,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        session=session or (user if isinstance(user, str) else None),
        priority=priority,
    )
    return ParsedRequest(kind, body, data, model, stream, request_id, features)
