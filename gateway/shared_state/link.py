"""What identifies a process to the others, the counters of its link to Redis, what a round
trip may raise, and when a run of late round trips counts as the link being down."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from dataclasses import dataclass

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

# What a Redis call may raise besides CancelledError (never caught): its errors, a socket's,
# and our own deadline.
FAILURES = (RedisError, OSError, TimeoutError)
# Late, not refused: within late_grace_s these leave the link up.
TIMEOUTS = (TimeoutError, RedisTimeoutError)


def reraise_cancel() -> None:
    """Raise CancelledError if the current task is being cancelled."""
    # A client library may turn our cancellation into its own error, or (asyncio.wait_for on
    # 3.11) return a result it raced with: never swallow it.
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


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
    # Round trips past their timeout that did not take the link down (within late_grace_s).
    late_ops: int = 0


class Lateness:
    """A run of timeouts counts as down only once it has lasted `grace_s` with no answer.

    On a saturated host one late round trip is common (measured on 2 cores with 4 vLLM CPU
    replicas: beats past 0.25 s); going down on it drops every process's shared view at once
    and sends each to a full bootstrap on the way back up. A refused connection is down at once.
    """

    __slots__ = ("_since", "grace_s")

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._since: float | None = None

    def late(self, now: float) -> bool:
        """A round trip timed out at `now`: True once the run of them has lasted grace_s."""
        if self._since is None:
            self._since = now
        return now - self._since >= self.grace_s

    def answered(self) -> None:
        """A round trip was answered in time (or the link went down): the run is over."""
        self._since = None


def default_process_id() -> str:
    """host:pid:random: unique even for two gateways in one process (tests, the demo)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
