"""The tokens an answer used, read from vLLM's `usage` without parsing the whole answer."""

from __future__ import annotations

import re

# Completion stream chunks carry `"usage":null` each; only the usage object itself counts.
USAGE_MARK = b'"completion_tokens"'
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
# A usage object is a few hundred bytes (its details included).
_USAGE_SPAN = 1024


def usage_tokens(data: bytes) -> int | None:
    """prompt + completion tokens of the last `usage` object in `data`, or None if none."""
    start = -1
    # Usage comes last (after the choices of a body, in the last event of a stream).
    at = data.rfind(b'"usage"')
    while at >= 0:
        if _USAGE.match(data, at):
            start = at
            break
        at = data.rfind(b'"usage"', 0, at)
    if start < 0:
        return None
    end = start + _USAGE_SPAN
    prompt = _PROMPT.search(data, start, end)
    completion = _COMPLETION.search(data, start, end)
    if prompt is None or completion is None:
        return None
    return int(prompt[1]) + int(completion[1])
