"""Logs every garbage collection of the process (generation, duration) to /tmp/gclog/PID.log.

Put in a copy of the tree as `sitecustomize.py`; the gateway started from it imports it first.
"""

import gc
import os
import time
from typing import Any

_log = open(f"/tmp/gclog/{os.getpid()}.log", "a", buffering=1)  # noqa: SIM115 - process-long
_started = [0.0]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    took_ms = 1000 * (time.perf_counter() - _started[0])
    gen, got = info["generation"], info["collected"]
    _log.write(f"{time.time():.3f} gen{gen} {took_ms:.2f}ms collected {got}\n")


gc.callbacks.append(_on_gc)
