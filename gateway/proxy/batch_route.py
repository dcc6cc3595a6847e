"""vLLM's /v1/chat/completions/batch through the gateway: N conversations, one JSON answer.

Routing uses the first conversation, rendered as /v1/chat/completions renders it. vLLM runs
every conversation of the batch on the one replica that gets it, each a request of its own
in the same prefix cache. The index's match is a longest-prefix match, so a prefix the
conversations share (the usual batch: one system prompt, many inputs) is found through the
first conversation alone; and what is recorded afterwards (all of the first conversation's
blocks) is truly cached there. A longest-common-prefix of all N would render and hash every
conversation on the event loop to find no more than that, and would record less. It also
makes a batch whose first conversation was sent before as a chat go where that chat went.
"""

from __future__ import annotations

from typing import Any


def routing_conversation(data: dict[str, Any]) -> list[Any]:
    """The conversation a batch's cache features come from (parse_request checked its shape)."""
    conversations: list[list[Any]] = data["messages"]
    return conversations[0]
