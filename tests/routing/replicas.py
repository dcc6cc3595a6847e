"""Shared builders for routing tests: replica snapshots from a few keyword arguments."""

from __future__ import annotations

from routing import ReplicaSnapshot, RequestFeatures

MODEL = "llama"
REQUEST = RequestFeatures(model=MODEL, request_id="req-1")


def replica(name: str, *, models: tuple[str, ...] = (MODEL,), **fields: object) -> ReplicaSnapshot:
    """A replica named `name` serving `models`, other fields as given."""
    return ReplicaSnapshot(
        name=name,
        url=f"http://{name}.test:8000",
        models=frozenset(models),
        **fields,  # type: ignore[arg-type]
    )


def names(replicas: object) -> list[str]:
    """Names of a sequence of replicas, in order."""
    return [r.name for r in replicas]  # type: ignore[attr-defined]
