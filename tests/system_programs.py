"""System programs a test needs (benchmarks/system_deps.py installs them): skip, or fail in CI."""

from __future__ import annotations

import os

import pytest

from benchmarks.system_deps import which


def program(name: str) -> str:
    """`name`'s path; skips the test without it, fails it in CI (nothing skips there)."""
    found = which(name)
    if found is None:
        message = f"{name} is not installed (python -m benchmarks.vllm_cpu prepare)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found
