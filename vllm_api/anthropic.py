"""vLLM's Anthropic Messages wire format: error body, usage, stop reasons, stream events."""

from __future__ import annotations

from typing import Any

import orjson

from vllm_api.named_sse import frame

# The events of a streamed answer, in the order vLLM sends them (deltas repeat; a content
# block is opened only once text arrives; "error" replaces the tail when generation fails).
STREAM_EVENTS = (
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
)


def error_body(err_type: str, message: str) -> bytes:
    """An error vLLM's Messages handler answers: ``{"type":"error","error":{type,message}}``.

    Its ``type`` is vLLM's own error type name (NotFoundError, BadRequestError...), not
    Anthropic's snake_case one. Request-validation errors keep vLLM's OpenAI shape."""
    return orjson.dumps({"type": "error", "error": {"type": err_type, "message": message}})


def stream_error_event(message: str) -> bytes:
    """The ``error`` event a Messages stream ends with when generation fails."""
    body = {"type": "error", "error": {"type": "internal_error", "message": message}}
    return frame("error", orjson.dumps(body))


def usage(prompt: int, output: int, cached: int | None, created: int | None) -> dict[str, Any]:
    """Anthropic's usage from vLLM's counts: input_tokens excludes cache reads and writes.

    ``cached``/``created`` None (prompt-token details off) leave their fields out."""
    out: dict[str, Any] = {"input_tokens": 0, "output_tokens": output}
    rest = prompt
    if cached is not None:
        rest -= cached
        out["cache_read_input_tokens"] = cached
    if created is not None:
        rest -= created
        out["cache_creation_input_tokens"] = created
    out["input_tokens"] = max(0, rest)
    # vLLM's model declares creation before read; dumps follow the declaration order.
    order = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
             "cache_read_input_tokens")  # fmt: skip
    return {k: out[k] for k in order if k in out}


def stop_reason(
    finish_reason: str | None, stop_string: str | None
) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) for an OpenAI finish reason and matched stop string."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if stop_string is not None:
        return "stop_sequence", stop_string
    if finish_reason == "tool_calls":
        return "tool_use", None
    return "end_turn", None


# Claude Code's attribution header: vLLM drops it from system text (it defeats caching).
BILLING_HEADER = "x-anthropic-billing-header"


def _texts(blocks: list[Any]) -> list[str]:
    return [
        str(b["text"])
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "text" and b.get("text")
    ]


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's to_chat_completion_request: the OpenAI chat a Messages body is rendered as.

    System (a string, or text blocks joined) first, then each message; several text blocks
    of a message are joined with newlines; a user message left without text is dropped.
    """
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        out.append({"role": "system", "content": system})
    elif isinstance(system, list):
        parts = [t for t in _texts(system) if not t.startswith(BILLING_HEADER)]
        if parts:
            out.append({"role": "system", "content": "".join(parts)})
    for m in body["messages"]:
        content = m["content"]
        if isinstance(content, list):
            texts = _texts(content)
            if m["role"] == "system":
                content = "".join(t for t in texts if not t.startswith(BILLING_HEADER))
            elif not texts:
                if m["role"] == "user":
                    continue  # vLLM drops a user message left without content
                content = ""
            else:
                content = "\n".join(texts)
        if m["role"] == "system" and not content:
            continue
        out.append({"role": m["role"], "content": content})
    return out
