"""Stored Responses: response id -> the replica that keeps it (vLLM stores them in memory)."""

from __future__ import annotations

from collections import OrderedDict


class ResponseIndex:
    """Bounded LRU map from a stored response's id to the replica that created it.

    The entry outlives its replica's removal on purpose: a follow-up then gets "its replica
    is gone" rather than "unknown id", which tells the client to start a new conversation.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be positive")
        self._max = max_entries
        self._items: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, replica: str) -> None:
        """Remember that `replica` stored `response_id`; the least recently used is dropped."""
        items = self._items
        items[response_id] = replica
        items.move_to_end(response_id)
        if len(items) > self._max:
            items.popitem(last=False)

    def get(self, response_id: str) -> str | None:
        """The replica that stored `response_id` (now most recently used), or None."""
        replica = self._items.get(response_id)
        if replica is not None:
            self._items.move_to_end(response_id)
        return replica
