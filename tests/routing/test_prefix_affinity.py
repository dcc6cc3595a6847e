from __future__ import annotations

import pytest

from routing import PLUGINS, RequestFeatures
from tests.routing.replicas import MODEL, replica

FLEET = [replica(n) for n in ("a", "b", "c")]


@pytest.mark.parametrize(
    ("blocks", "match", "expected"),
    [
        (4, {"a": 4, "b": 2}, [1.0, 0.5, 0.0]),
        (4, {"c": 1}, [0.0, 0.0, 0.25]),
        (3, {}, [0.0, 0.0, 0.0]),
        # No full block in the prompt: nothing to match.
        (0, {"a": 2}, [0.0, 0.0, 0.0]),
        # A replica the index does not know, and an over-count, stay in [0, 1].
        (2, {"zzz": 2, "b": 5}, [0.0, 1.0, 0.0]),
    ],
)
def test_prefix_affinity_is_the_matched_fraction(
    blocks: int, match: dict[str, int], expected: list[float]
) -> None:
    request = RequestFeatures(model=MODEL, block_hashes=tuple(range(blocks)), prefix_match=match)
    scores = PLUGINS["prefix_affinity"].build({}).score(request, FLEET)
    assert scores == pytest.approx(expected)
