"""Lint and types are part of the suite: ruff everywhere, mypy --strict on every product package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_check_and_format() -> None:
    check = _run("ruff", "check", ".")
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = _run("ruff", "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


# Every package of the product, and the benchmarks that import it.
PACKAGES = ("gateway", "routing", "cache_index", "vllm_api", "simulator", "telemetry", "benchmarks")


def test_mypy_strict_on_every_package() -> None:
    result = _run("mypy", *PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr
