"""The fleet's models as /v1/models and gRPC ListModels list them: one card per id."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def model_cards(
    replicas: Iterable[tuple[bool, tuple[dict[str, Any], ...]]],
) -> list[dict[str, Any]]:
    """The union of the (healthy, cards) replicas' models and adapters, each id once.

    vLLM reports `max_model_len` on a base model's card only: an adapter gets its parent's.
    Replicas that disagree report the smallest, the longest request every one of them takes.
    """
    seen: dict[str, dict[str, Any]] = {}
    base_len: dict[str, int] = {}
    for healthy, cards in replicas:
        if not healthy:
            continue
        for card in cards:
            mid = str(card.get("id"))
            length = card.get("max_model_len")
            if isinstance(length, int):
                base_len[mid] = min(length, base_len.get(mid, length))
            seen.setdefault(mid, card)
    out = []
    for mid, card in seen.items():
        parent = card.get("parent")
        length = base_len.get(mid, base_len.get(parent) if isinstance(parent, str) else None)
        same = card.get("max_model_len") == length
        out.append(card if same else {**card, "max_model_len": length})
    return out
