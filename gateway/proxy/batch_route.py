"""vLLM's /v1/chat/completions/batch through the gateway: N conversations, one JSON answer.

Routing uses the first conversation, rendered as /v1/chat/completions renders it. vLLM runs
every conversation of the batch on the one replica that gets it, each a request of its own
in the same prefix cache. The index's match is a longest-prefix match, so a prefix the
conversations share (the usual batch: one system prompt, many inputs) is found through the
first conversation alone; and what is recorded afterwards (all of the first conversation's
blocks) is truly cached there. A longest-common-prefix of all N would render and hash every
conversation on the event loop to find no more than that, and would record less. It also
makes a batch whose first conversation was sent before as a chat go where that chat went.

Its size, though, is the whole batch's: the admission queue's length bucket, the prefill the
replica is counted for, the instance class and the prefill-cost picker see every
conversation's prompt tokens (the first's as its rendering counts them, the others estimated
from their characters, as parse_request estimates them), so a batch of long conversations
behind a short first one is not taken for a short request.
"""

from __future__ import annotations

from typing import Any

from gateway.proxy.requests import conversation_chars


def routing_conversation(data: dict[str, Any]) -> list[Any]:
    """The conversation a batch's cache features come from (parse_request checked its shape)."""
    conversations: list[list[Any]] = data["messages"]
    return conversations[0]


def prompt_tokens(data: dict[str, Any], first_tokens: int) -> int:
    """The batch's prompt tokens, given its routing conversation's `first_tokens`."""
    conversations: list[list[Any]] = data["messages"]
    return first_tokens + sum(conversation_chars(c) for c in conversations[1:]) // 4
