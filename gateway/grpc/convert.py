"""Proto messages <-> the OpenAI JSON the pipeline forwards, and routing hints from metadata."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

import orjson

from gateway.grpc.gen import gateway_pb2 as pb
from gateway.proxy import hints, identity
from gateway.proxy.hints import Hints
from gateway.proxy.requests import Kind

Request = pb.CompletionRequest | pb.ChatRequest
Metadata = Sequence[tuple[str, str | bytes]]
# Transport keys of gRPC itself; the rest is passed on like HTTP headers are, so the pipeline
# reads session and other routing headers the same way for both front ends.
_TRANSPORT = frozenset({"user-agent", "content-type", "te", "authorization"})


def _passed_on(key: str) -> bool:
    return not (key.startswith(("grpc-", ":")) or key.endswith("-bin") or key in _TRANSPORT)


def request_id(metadata: Metadata, key: str = "x-request-id") -> str:
    """The client's request id when it is short and plain, else a fresh one (as over HTTP)."""
    for k, value in metadata:
        if k == key and isinstance(value, str):
            return identity.request_id(value)
    return identity.new_request_id()


def read_hints(metadata: Metadata) -> Hints:
    """Hints from metadata; a malformed priority or model hint is refused."""
    values: dict[str, str] = {}
    headers: list[tuple[bytes, bytes]] = []
    for key, value in metadata:
        if not isinstance(value, str) or not _passed_on(key):
            continue
        hints.collect(values, key, value)
        headers.append((key.encode("latin-1"), value.encode("latin-1", "replace")))
    return replace(hints.parse(values, "metadata"), headers=tuple(headers))


def _float(value: float) -> float:
    # proto floats are 32-bit: send 0.7, not 0.699999988079071.
    return float(f"{value:.7g}")


def request_body(kind: Kind, req: Request, stream: bool) -> bytes:
    """The OpenAI request body equivalent to `req`; only fields the client set are present."""
    body: dict[str, Any] = {"model": req.model}
    if isinstance(req, pb.ChatRequest):
        body["messages"] = [{"role": m.role, "content": m.content} for m in req.messages]
    else:
        which = req.WhichOneof("prompt")
        if which == "text":
            body["prompt"] = req.text
        elif which == "token_ids":
            body["prompt"] = list(req.token_ids.ids)
    if req.HasField("max_tokens"):
        body["max_tokens"] = req.max_tokens
    if req.HasField("temperature"):
        body["temperature"] = _float(req.temperature)
    if req.HasField("top_p"):
        body["top_p"] = _float(req.top_p)
    if req.stop:
        body["stop"] = list(req.stop)
    if req.HasField("seed"):
        body["seed"] = req.seed
    if req.user:
        body["user"] = req.user
    if req.HasField("priority"):
        body["priority"] = req.priority
    if req.HasField("ignore_eos"):
        body["ignore_eos"] = req.ignore_eos
    if stream:
        body["stream"] = True
        if req.include_usage:
            body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


def _usage(data: Any) -> pb.Usage | None:
    if not isinstance(data, Mapping):
        return None
    details = data.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return pb.Usage(
        prompt_tokens=data.get("prompt_tokens") or 0,
        completion_tokens=data.get("completion_tokens") or 0,
        total_tokens=data.get("total_tokens") or 0,
        cached_tokens=cached if isinstance(cached, int) else None,
    )


def _reasons(choice: Mapping[str, Any]) -> dict[str, Any]:
    stop = choice.get("stop_reason")
    return {
        "index": choice.get("index") or 0,
        "finish_reason": choice.get("finish_reason"),
        # vLLM reports a stop token id as an int, a stop string as a string.
        "stop_reason": None if stop is None else str(stop),
    }


def _message(data: Any) -> pb.ChatMessage:
    if not isinstance(data, Mapping):
        return pb.ChatMessage()
    return pb.ChatMessage(role=data.get("role") or "", content=data.get("content") or "")


def _choices(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    choices = data.get("choices")
    return [c for c in choices if isinstance(c, Mapping)] if isinstance(choices, list) else []


def _top(data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": data.get("id") or "",
        "model": data.get("model") or "",
        "created": data.get("created") or 0,
        "usage": _usage(data.get("usage")),
    }


Shape = Literal["completion", "chat", "chat_chunk"]


def to_proto(shape: Shape, data: Mapping[str, Any]) -> Any:
    """A vLLM response body or stream chunk (parsed JSON) as its proto message."""
    choices = _choices(data)
    if shape == "completion":
        return pb.CompletionResponse(
            **_top(data),
            choices=[pb.CompletionChoice(text=c.get("text") or "", **_reasons(c)) for c in choices],
        )
    if shape == "chat":
        return pb.ChatResponse(
            **_top(data),
            choices=[
                pb.ChatChoice(message=_message(c.get("message")), **_reasons(c)) for c in choices
            ],
        )
    return pb.ChatChunk(
        **_top(data),
        choices=[
            pb.ChatChunkChoice(delta=_message(c.get("delta")), **_reasons(c)) for c in choices
        ],
    )


def response_shape(kind: Kind, stream: bool) -> Shape:
    """Which proto message answers a request of `kind`."""
    if kind == "completions":
        return "completion"
    return "chat_chunk" if stream else "chat"


def model_list(cards: Sequence[Mapping[str, Any]]) -> pb.ListModelsResponse:
    """The gateway's model cards (base models and LoRA adapters) as a ListModelsResponse."""
    models = []
    for card in cards:
        parent = card.get("parent")
        max_len = card.get("max_model_len")
        models.append(
            pb.Model(
                id=str(card.get("id") or ""),
                owned_by=str(card.get("owned_by") or ""),
                created=card.get("created") if isinstance(card.get("created"), int) else 0,
                parent=parent if isinstance(parent, str) else None,
                max_model_len=max_len if isinstance(max_len, int) else None,
            )
        )
    return pb.ListModelsResponse(models=models)
