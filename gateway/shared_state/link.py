"""What identifies a process to the others, and the counters of its link to Redis."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass


@dataclass(slots=True)
class SharedStats:
    """Counters of the link to Redis (read by the metrics at scrape time)."""

    failed_ops: int = 0
    published: int = 0
    dropped: int = 0
    # Writes Redis refused as older than what it held (another process decided later).
    rejected_stale: int = 0
    peers: int = 0
    downs: int = 0


def default_process_id() -> str:
    """host:pid:random: unique even for two gateways in one process (tests, the demo)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
