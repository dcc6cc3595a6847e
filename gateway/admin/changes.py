"""Admin changes under `--workers`: applied by every worker, journaled for a restarted one.

The worker that answers an admin mutation applies it, appends it to the journal (a file in the
supervisor's 0700 directory) and hands it to each sibling over its private socket; the
supervisor journals SIGHUP's reload and hands it to every worker the same way. A worker started
later replays the journal before it serves: the start-up config plus every change since, in
order. A change is known by its offset in the journal, so one that reaches a starting worker
both ways is applied once. Changes from two workers at the same moment may be applied in either
order by a third; discovery's own changes are each worker's, and are not journaled.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from gateway.admin.fleet import FleetError, parse_replica
from gateway.admin.reload import reload_from_file
from gateway.config_loader import ConfigError

if TYPE_CHECKING:
    from gateway.runtime import Runtime

log = logging.getLogger("llm_gateway.admin")

JOURNAL = "changes.jsonl"
_OPS = ("add", "remove", "drain", "undrain", "reload")


@dataclass(frozen=True, slots=True)
class Change:
    """One accepted admin mutation, as a sibling (or a restarted worker) applies it."""

    op: str
    name: str = ""
    # add: the [[replicas]] table as it was posted (validated again where it is applied).
    replica: dict[str, Any] = field(default_factory=dict)
    force: bool = False
    wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown admin change {self.op!r}")

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> Change:
        data = orjson.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("an admin change is a JSON object")
        return cls(**data)


def append(channel_dir: str, change: Change) -> int:
    """Journal `change` (blocking file I/O: call it in a thread); its offset, its id."""
    fd = os.open(os.path.join(channel_dir, JOURNAL), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        # Workers and the supervisor append: the lock keeps each line whole and its offset true.
        fcntl.flock(fd, fcntl.LOCK_EX)
        offset = os.fstat(fd).st_size
        os.write(fd, change.encode() + b"\n")
        return offset
    finally:
        os.close(fd)  # releases the lock


def read(channel_dir: str) -> list[tuple[int, Change]]:
    """Every journaled change with its offset, oldest first (blocking: call it in a thread)."""
    try:
        fd = os.open(os.path.join(channel_dir, JOURNAL), os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
    finally:
        os.close(fd)
    out: list[tuple[int, Change]] = []
    offset = 0
    for line in data.splitlines(keepends=True):
        out.append((offset, Change.decode(line)))
        offset += len(line)
    return out


def remove_journal(channel_dir: str) -> None:
    """The journal goes with the directory (the last worker out of a dead supervisor's)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(channel_dir, JOURNAL))


async def apply(runtime: Runtime, change: Change) -> str:
    """Apply a change another worker accepted: "ok", or "error: why" (nothing is raised)."""
    fleet = runtime.fleet
    try:
        if change.op == "add":
            await fleet.add(parse_replica(change.replica), "admin")
        elif change.op == "remove":
            removal = await fleet.remove(change.name, change.force, change.wait_s)
            if not removal.removed:
                return f"error: {removal.outcome} ({removal.in_flight} in flight)"
        elif change.op == "drain":
            fleet.drain(change.name)
        elif change.op == "undrain":
            fleet.undrain(change.name)
        else:
            result = await reload_from_file(runtime)
            log.info("reload done: %s", result.as_dict())
            if result.failed:
                return f"error: replicas not changed: {result.failed}"
    except FleetError as exc:
        return f"error: {exc.message}"
    except (ConfigError, OSError) as exc:  # a reload's file unreadable, invalid
        if change.op == "reload":
            log.error("reload refused, nothing changed: %s", exc)
        return f"error: {exc}"
    return "ok"
