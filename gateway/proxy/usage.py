"""The tokens an answer used, read from vLLM's `usage` without parsing the whole answer.

Three shapes: OpenAI's chat, completions, embeddings and pooling (`prompt_tokens`, with
`completion_tokens` except for rerank), Responses (`input_tokens` with cached ones among them,
`output_tokens`) and Anthropic Messages (`input_tokens` without the cache reads and writes,
which come as their own counts). A stream's last usage object is its whole count: a chat's
usage chunk, a Responses stream's `response.completed`, a Messages stream's `message_delta`.
"""

from __future__ import annotations

import re

# Completion stream chunks carry `"usage":null` each; only the usage object itself counts.
USAGE_MARK = b'"completion_tokens"'
# Responses' and Messages' streams: the events that may carry a usage object.
IO_USAGE_MARK = b'"output_tokens"'
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_INPUT = re.compile(rb'"input_tokens"\s*:\s*(\d+)')
_OUTPUT = re.compile(rb'"output_tokens"\s*:\s*(\d+)')
# Anthropic's: input_tokens leaves these out (Responses counts its cached tokens in input).
_CACHE_READ = re.compile(rb'"cache_read_input_tokens"\s*:\s*(\d+)')
_CACHE_WRITE = re.compile(rb'"cache_creation_input_tokens"\s*:\s*(\d+)')
# A usage object is a few hundred bytes (its details, and Responses' per-turn counts, included).
_USAGE_SPAN = 2048


def usage_marked(chunk: bytes) -> bool:
    """True when `chunk` may hold (the start of) a usage object worth parsing."""
    return USAGE_MARK in chunk or IO_USAGE_MARK in chunk


def _count(pattern: re.Pattern[bytes], data: bytes, start: int, end: int) -> int | None:
    found = pattern.search(data, start, end)
    return int(found[1]) if found is not None else None


def _usage_at(data: bytes) -> int:
    """Where the last `usage` object in `data` starts, or -1."""
    # Usage comes last (after the choices of a body, in the last event of a stream).
    at = data.rfind(b'"usage"')
    while at >= 0:
        if _USAGE.match(data, at):
            return at
        at = data.rfind(b'"usage"', 0, at)
    return -1


def _prompt_count(data: bytes, start: int, end: int) -> int | None:
    prompt = _count(_PROMPT, data, start, end)
    if prompt is not None:
        return prompt
    given = _count(_INPUT, data, start, end)
    if given is None:
        return None
    read = _count(_CACHE_READ, data, start, end) or 0
    return given + read + (_count(_CACHE_WRITE, data, start, end) or 0)


def usage_tokens(data: bytes) -> int | None:
    """Prompt + generated tokens of the last `usage` object in `data`, or None if none."""
    start = _usage_at(data)
    if start < 0:
        return None
    end = start + _USAGE_SPAN
    prompt = _count(_PROMPT, data, start, end)
    if prompt is not None:
        return prompt + (_count(_COMPLETION, data, start, end) or 0)
    output = _count(_OUTPUT, data, start, end)
    given = _prompt_count(data, start, end)
    if given is None or output is None:
        return None
    return given + output


def prompt_usage(data: bytes) -> int | None:
    """The prompt tokens of the last `usage` object in `data` (input, with cache reads and
    writes for Messages), or None if none."""
    start = _usage_at(data)
    return None if start < 0 else _prompt_count(data, start, start + _USAGE_SPAN)
