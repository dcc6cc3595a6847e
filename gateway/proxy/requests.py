"""Parse an OpenAI request body once and extract what routing needs."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, fields
from itertools import chain
from operator import attrgetter
from typing import Any, Literal
from urllib.parse import parse_qs

import orjson

from gateway.errors import BadRequest, echo
from gateway.proxy import audio_route, pooling_route
from routing.types import RequestFeatures

Kind = Literal[
    "chat",
    "completions",
    "responses",
    "messages",
    "count_tokens",
    "response_get",
    "response_cancel",
    "tokenize",
    "detokenize",
    "embeddings",
    "pooling",
    "classify",
    "score",
    "rerank",
    "chat_batch",
    "transcription",
    "translation",
]
# Routes whose body only routing reads (model, stream): the replica validates the rest.
PASS_KINDS: frozenset[Kind] = frozenset(
    {"responses", "messages", "count_tokens", "tokenize", "detokenize"}
)
# Embeddings and vLLM's pooling family: nothing generated, never streamed, placed by load.
POOLING_KINDS: frozenset[Kind] = frozenset({"embeddings", "pooling", "classify", "score", "rerank"})
# A stored response's retrieval and cancel: no body, routed to the replica that stored it.
STORED_KINDS: frozenset[Kind] = frozenset({"response_get", "response_cancel"})
# vLLM's speech-to-text routes: multipart bodies, no cache features, placed by load.
AUDIO_KINDS: frozenset[Kind] = frozenset({"transcription", "translation"})
# Routes whose errors the gateway answers in Anthropic's shape.
ANTHROPIC_KINDS: frozenset[Kind] = frozenset({"messages", "count_tokens"})

# A 4-byte unsigned typecode: token ids are checked to fit uint32, as the block hashes pack them.
_U32 = "I" if array("I").itemsize == 4 else "L"
_PROMPT_SHAPE = (
    "`prompt` must be a string, an array of strings, an array of token ids "
    "(integers from 0 to 2**32 - 1) or an array of arrays of token ids."
)


# RequestFeatures copied positionally (as routing/router.py does): dataclasses.replace looks
# its fields up on every call and costs about twice as much, on every request.
_FEATURE_FIELDS = tuple(f.name for f in fields(RequestFeatures))
_FEATURE_VALUES = attrgetter(*_FEATURE_FIELDS)
_FEATURE_INDEX = {name: i for i, name in enumerate(_FEATURE_FIELDS)}


def with_features(features: RequestFeatures, **changes: Any) -> RequestFeatures:
    """`dataclasses.replace(features, **changes)`, cheaper (TypeError on an unknown field)."""
    values = list(_FEATURE_VALUES(features))
    for name, value in changes.items():
        try:
            values[_FEATURE_INDEX[name]] = value
        except KeyError:
            raise TypeError(f"RequestFeatures has no field {name!r}") from None
    return RequestFeatures(*values)


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
    # A stored response this request must reach (previous_response_id, GET or cancel of it).
    response_id: str | None = None
    # A GET's query string (retrieval's `stream`, `starting_after`), passed on as it came.
    query: str = ""


def conversation_chars(messages: list[Any]) -> int:
    """A conversation's text in characters: its prompt-token estimate is a quarter of it."""
    # Any shape goes: the replica validates messages, the gateway only estimates their size.
    total = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += len(part["text"])
    return total


def _token_ids(value: list[Any]) -> bool:
    """True for a list of token ids (integers in [0, 2**32)): one pass in C, no Python loop."""
    try:
        array(_U32).fromlist(value)
    except (TypeError, OverflowError):
        return False
    return True


def _prompt_chars(prompt: Any) -> int:
    """Check `prompt` has a shape vLLM accepts; its size in characters (~4 per token id)."""
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        # Checked in C, no Python step per item (orjson makes exact types): a body of a
        # million tiny items then costs less to check than to parse.
        if isinstance(first, str):
            if set(map(type, prompt)) == {str}:
                return sum(map(len, prompt))
        elif isinstance(first, list):
            if set(map(type, prompt)) == {list}:
                ids = list(chain.from_iterable(prompt))
                if _token_ids(ids):
                    return 4 * len(ids)
        elif _token_ids(prompt):
            return 4 * len(prompt)
    raise BadRequest(_PROMPT_SHAPE, param="prompt")


def _text_chars(value: Any) -> int:
    """Characters of a string, or of the text parts of a message list (any other shape: 0)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return conversation_chars(value)
    return 0


def _pass_through(
    kind: Kind, body: bytes, data: dict[str, Any], model: str, request_id: str
) -> ParsedRequest:
    stream = data.get("stream")
    if stream is None or kind not in ("responses", "messages"):
        stream = False
    elif not isinstance(stream, bool):
        raise BadRequest("`stream` must be a boolean.", param="stream")
    if kind == "responses":
        chars = _text_chars(data.get("instructions")) + _text_chars(data.get("input"))
        max_tokens = data.get("max_output_tokens")
    else:
        chars = _text_chars(data.get("system")) + _text_chars(data.get("messages"))
        max_tokens = data.get("max_tokens") if kind == "messages" else None
    priority = data.get("priority", 0)
    user = data.get("user")
    features = RequestFeatures(
        model=model,
        request_id=request_id,
        prompt_tokens=chars // 4,
        max_tokens=max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None,
        stream=stream,
        session=user if isinstance(user, str) else None,
        priority=priority if isinstance(priority, int) else 0,
    )
    prev = data.get("previous_response_id") if kind == "responses" else None
    pin = prev if isinstance(prev, str) and prev else None
    return ParsedRequest(kind, body, data, model, stream, request_id, features, pin)


def stored_request(kind: Kind, response_id: str, request_id: str, query: str = "") -> ParsedRequest:
    """GET or cancel of a stored response: no body, no model (its replica's model is used)."""
    # The metrics' label for a model not known (the request names none).
    model = "_unknown"
    # vLLM's retrieval streams the stored events with ?stream=true (a FastAPI bool).
    stream = kind == "response_get" and _query_flag(query, "stream")
    features = RequestFeatures(model=model, request_id=request_id, stream=stream)
    return ParsedRequest(kind, b"", {}, model, stream, request_id, features, response_id, query)


def _query_flag(query: str, name: str) -> bool:
    """A query parameter's truth as pydantic reads a bool (true, 1, yes, on)."""
    for value in parse_qs(query).get(name, ()):
        return value.lower() in ("true", "1", "yes", "on", "t", "y")
    return False


def _pooling(
    kind: Kind, body: bytes, data: dict[str, Any], model: str, request_id: str
) -> ParsedRequest:
    # vLLM takes `stream` here as an unknown field (logged, ignored): the answer is one body.
    priority = data.get("priority", 0)
    features = RequestFeatures(
        model=model,
        request_id=request_id,
        prompt_tokens=pooling_route.input_chars(kind, data) // 4,
        max_tokens=None,
        priority=priority if isinstance(priority, int) else 0,
    )
    return ParsedRequest(kind, body, data, model, False, request_id, features)


def _chat_batch(
    body: bytes, data: dict[str, Any], model: str, request_id: str, session: str | None
) -> ParsedRequest:
    # vLLM's batch route has no `stream` field: a `stream` sent is ignored, the answer is
    # one JSON body; so the gateway never waits for a stream either.
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty array of conversations.", param="messages")
    chars = 0
    for i, conversation in enumerate(messages):
        if not isinstance(conversation, list) or not conversation:
            raise BadRequest("Each conversation must be a non-empty array.", param=f"messages.{i}")
        chars += conversation_chars(conversation)
    max_tokens, priority = _budget(data)
    user = data.get("user")
    features = RequestFeatures(
        model=model,
        request_id=request_id,
        prompt_tokens=chars // 4,
        # Each conversation may generate up to max_tokens.
        max_tokens=None if max_tokens is None else max_tokens * len(messages),
        stream=False,
        session=session or (user if isinstance(user, str) else None),
        priority=priority,
    )
    return ParsedRequest("chat_batch", body, data, model, False, request_id, features)


def _audio(kind: Kind, body: bytes, request_id: str) -> ParsedRequest:
    form, model, stream = audio_route.read_form(body)
    features = RequestFeatures(model=model, request_id=request_id, stream=stream)
    return ParsedRequest(kind, body, dict(form.fields), model, stream, request_id, features)


def parse_request(
    kind: Kind, body: bytes, request_id: str, session: str | None = None
) -> ParsedRequest:
    """Validate the fields the gateway relies on; the replica validates the rest."""
    if kind in AUDIO_KINDS:
        return _audio(kind, body, request_id)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"Invalid JSON in request body: {echo(exc.msg)}") from None
    if not isinstance(data, dict):
        raise BadRequest("The request body must be a JSON object.")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("`model` is required and must be a non-empty string.", param="model")
    if kind in PASS_KINDS:
        return _pass_through(kind, body, data, model, request_id)
    if kind in POOLING_KINDS:
        return _pooling(kind, body, data, model, request_id)
    if kind == "chat_batch":
        return _chat_batch(body, data, model, request_id, session)
    if kind == "chat":
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("`messages` must be a non-empty array.", param="messages")
        prompt_chars = conversation_chars(messages)
    else:
        prompt = data.get("prompt")
        if prompt is None or prompt == "" or prompt == []:
            raise BadRequest("`prompt` is required.", param="prompt")
        prompt_chars = _prompt_chars(prompt)
    stream = data.get("stream")
    if stream is None:
        stream = False  # vLLM takes `"stream": null` as not streaming
    elif not isinstance(stream, bool):
        raise BadRequest("`stream` must be a boolean.", param="stream")
    max_tokens, priority = _budget(data)
    user = data.get("user")
    prompt_tokens = prompt_chars // 4
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


def _budget(data: dict[str, Any]) -> tuple[int | None, int]:
    """The body's `max_tokens` (or `max_completion_tokens`) and `priority`, checked."""
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise BadRequest("`max_tokens` must be a positive integer.", param="max_tokens")
    priority = data.get("priority", 0)
    if not isinstance(priority, int):
        raise BadRequest("`priority` must be an integer.", param="priority")
    return max_tokens, priority
