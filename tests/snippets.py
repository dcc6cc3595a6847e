"""Run a Python snippet in a fresh interpreter (clean sys.modules) and read its JSON answer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_snippet(code: str, argv: list[str]) -> tuple[dict[str, Any], str]:
    """(the JSON object the snippet printed last, its stderr); the snippet must exit 0."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result, proc.stderr
