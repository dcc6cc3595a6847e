from __future__ import annotations

import pytest

from routing import PLUGINS, RequestFeatures
from tests.routing.replicas import names, replica

FLEET = [
    replica("base", models=("llama",)),
    replica("lora", models=("llama", "llama-sql")),
    replica("other", models=("qwen",)),
    replica("none", models=()),
]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("llama", ["base", "lora"]),
        ("llama-sql", ["lora"]),
        ("qwen", ["other"]),
        ("missing", []),
        ("", []),
    ],
)
def test_serves_model_filter(model: str, expected: list[str]) -> None:
    plugin = PLUGINS["serves_model"].build({})
    assert names(plugin.filter(RequestFeatures(model=model), FLEET)) == expected
