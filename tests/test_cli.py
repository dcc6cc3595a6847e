"""The `llm-gateway` command line: a benchmark without the bench extra stops before it starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import BENCH_INSTALL
from tests.snippets import run_snippet

ROOT = Path(__file__).resolve().parents[1]

# matplotlib is hidden (find_spec returns None for a None entry in sys.modules) and
# asyncio.run is replaced, so anything the command would start is recorded, not run.
_WITHOUT_BENCH_EXTRA = """
import asyncio, json, sys

sys.modules["matplotlib"] = None
started = []

def _record(coro, **kwargs):
    started.append(getattr(coro, "__qualname__", repr(coro)))
    coro.close()

asyncio.run = _record
from gateway.cli import main

rc = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("benchmarks", "simulator"))
print(json.dumps({"rc": rc, "started": started, "loaded": loaded}))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "routing", "--quick"],
        ["bench", "routing", "--quick", "--fleet", "sim", "--out", "unused"],
        ["--log-level", "warning", "bench", "overhead"],
        ["bench", "routing-cost", "--quick"],
    ],
)
def test_bench_without_the_extra_exits_2_with_the_install_command(argv: list[str]) -> None:
    result, stderr = run_snippet(_WITHOUT_BENCH_EXTRA, argv)
    assert result == {"rc": 2, "started": [], "loaded": []}
    assert "missing: matplotlib" in stderr
    assert BENCH_INSTALL in stderr
    # The command's own options are not reported as unknown: it stopped before parsing them.
    assert "unrecognized arguments" not in stderr
