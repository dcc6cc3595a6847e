from __future__ import annotations

from pathlib import Path

import routing.plugins
from routing import PLUGINS, describe_plugins
from routing.plugin import KIND_METHOD

PLUGIN_DIR = Path(routing.plugins.__file__).parent


def test_every_plugin_module_is_registered_under_its_own_name() -> None:
    modules = {p.stem for p in PLUGIN_DIR.glob("*.py") if p.stem != "__init__"}
    assert set(PLUGINS) == modules
    for key, factory in PLUGINS.items():
        assert factory.type == key


def test_first_plugins_have_the_expected_kinds() -> None:
    kinds = {k: f.kind for k, f in PLUGINS.items()}
    assert {k: kinds[k] for k in ("healthy", "serves_model")} == dict.fromkeys(
        ("healthy", "serves_model"), "filter"
    )
    assert kinds["least_inflight"] == kinds["weight"] == "scorer"
    assert kinds["round_robin"] == kinds["random"] == kinds["max_score"] == "picker"
    assert kinds["affinity_guard"] == "picker"
    for name in ("saturation", "lora_affinity", "label"):
        assert kinds[name] == "filter", name
    for name in (
        *("prefix_affinity", "queue_load", "kv_utilization", "token_load", "cache_footprint"),
        *("seed_composite", "fusion", "latency_tier", "feedback_weight", "congestion"),
    ):
        assert kinds[name] == "scorer", name


def test_every_plugin_builds_with_defaults_and_has_its_kind_method() -> None:
    for factory in PLUGINS.values():
        plugin = factory.build({})
        assert callable(getattr(plugin, KIND_METHOD[factory.kind], None)), factory.type


def test_plugin_modules_stay_small() -> None:
    for path in PLUGIN_DIR.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 120, path.name


def test_describe_plugins_documents_every_plugin_and_param() -> None:
    infos = describe_plugins()
    assert [i.type for i in infos] == list(PLUGINS)
    for info in infos:
        assert info.doc and info.kind in KIND_METHOD
        assert all(p.doc and p.type for p in info.params), info.type
    max_score = next(i for i in infos if i.type == "max_score")
    assert {p.name: p.default for p in max_score.params} == {"seed": None, "tie_epsilon": 1e-9}
