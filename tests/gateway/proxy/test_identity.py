"""API keys and request ids shared by the HTTP and gRPC front ends."""

from __future__ import annotations

import multiprocessing
import re

import pytest

from gateway.proxy.identity import MAX_REQUEST_ID, ApiKeys, new_request_id, request_id


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("Bearer k1", True),
        (b"bearer  k2 ", True),
        ("Bearer k3", False),
        ("Basic k1", False),
        ("k1", False),
        (None, False),
    ],
)
def test_api_keys(value: str | bytes | None, ok: bool) -> None:
    keys = ApiKeys(["k1", "k2"])
    assert keys.enabled
    assert keys.accepts(value) is ok
    assert not ApiKeys([]).enabled


@pytest.mark.parametrize("value", ["abc-1", "x" * MAX_REQUEST_ID])
def test_plain_request_ids_are_kept(value: str) -> None:
    assert request_id(value) == value


@pytest.mark.parametrize("value", [None, "", "has space", "x" * (MAX_REQUEST_ID + 1), "a\nb"])
def test_other_request_ids_are_replaced(value: str | None) -> None:
    rid = request_id(value)
    assert rid != value and len(rid) == 32 and int(rid, 16) >= 0


def _child_id(queue: multiprocessing.Queue[str]) -> None:
    queue.put(new_request_id())


def test_fresh_ids_are_hex_distinct_and_not_repeated_by_a_forked_worker() -> None:
    ids = {new_request_id() for _ in range(10_000)}
    assert len(ids) == 10_000
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    # A forked child must not replay the parent's sequence (the generator is reseeded).
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[str] = ctx.Queue()
    child = ctx.Process(target=_child_id, args=(queue,))
    child.start()
    theirs = queue.get(timeout=30)
    child.join(timeout=30)
    assert theirs != new_request_id()
