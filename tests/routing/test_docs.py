"""docs/plugins.md is generated from the registry, and the plugin docstrings do not copy it."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from routing import PLUGINS, ParamInfo, PluginInfo, describe_plugins
from routing.docs import COMMAND, render

ROOT = Path(__file__).resolve().parents[2]
PLUGINS_MD = ROOT / "docs" / "plugins.md"


def test_the_committed_plugin_docs_are_the_generated_ones() -> None:
    committed = PLUGINS_MD.read_text() if PLUGINS_MD.exists() else ""
    assert committed == render(describe_plugins()), (
        f"docs/plugins.md is out of date: regenerate it with `{COMMAND}`"
    )


def test_the_module_entry_point_prints_the_same_text() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "routing.docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out == render(describe_plugins())


def test_every_plugin_is_documented_under_its_kind_with_every_param() -> None:
    text = render(describe_plugins())
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## Filters", "## Scorers", "## Pickers"]
    sections = dict(zip(("filter", "scorer", "picker"), text.split("\n## ")[1:], strict=True))
    for name, factory in PLUGINS.items():
        section = sections[factory.kind]
        assert f"### `{name}`\n\n{factory.doc}\n" in section, name
        for p in factory.describe().params:
            assert f"| `{p.name}` |" in section, (name, p.name)


def test_params_render_as_one_table_row_each_with_toml_defaults() -> None:
    info = PluginInfo(
        type="demo",
        kind="picker",
        doc="Picker: a demo.",
        params=(
            ParamInfo("seed", "int | None", None, "seed (None: from the OS)"),
            ParamInfo("on", "bool", True, "a flag"),
            ParamInfo("name", "str", "", "a name"),
            ParamInfo("eps", "float", 1e-9, "a tolerance | pipes escaped"),
        ),
    )
    bare = PluginInfo(type="bare", kind="filter", doc="Filter: bare.", params=())
    text = render([info, bare])
    assert "| `seed` | int \\| None | `None` | seed (None: from the OS) |" in text
    assert "| `on` | bool | `true` | a flag |" in text
    assert '| `name` | str | `""` | a name |' in text
    assert "| `eps` | float | `1e-09` | a tolerance \\| pipes escaped |" in text
    assert "### `bare`\n\nFilter: bare.\n\nSource: " in text
    assert text.index("### `bare`") < text.index("## Scorers") < text.index("### `demo`")
    assert "No parameters." in text
    for row in (line for line in text.splitlines() if line.startswith("| `")):
        assert row.replace("\\|", "").count("|") == 5, row


def test_plugin_docstrings_leave_params_to_their_param_docs() -> None:
    # A "Params:" section repeats types and defaults, which drift from the params dataclass.
    for name in PLUGINS:
        doc = importlib.import_module(f"routing.plugins.{name}").__doc__ or ""
        assert "Params:" not in doc and ", default " not in doc, name
