"""The serving process's collector settings: start-up frozen, young generation raised."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.http import gc_policy
from gateway.process import RunningGateway


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.usefixtures("restore_gc")
def test_tune_for_serving_freezes_start_up_and_raises_the_thresholds() -> None:
    gc.unfreeze()
    built_at_start_up = [object() for _ in range(10)], {"k": [1, 2]}
    gc_policy.tune_for_serving()
    assert gc.get_freeze_count() > 0
    # Frozen objects are out of every generation a collection scans.
    assert not any(gc.is_tracked(o) and o in gc.get_objects() for o in built_at_start_up)
    assert gc.get_threshold() == (
        gc_policy.GEN0_THRESHOLD,
        gc_policy.GEN1_THRESHOLD,
        gc_policy.GEN2_THRESHOLD,
    )


def test_an_embedded_gateway_leaves_the_collector_alone(gateway: RunningGateway) -> None:
    # Tests and the demo run the gateway inside someone else's process.
    assert gc.get_threshold() != (
        gc_policy.GEN0_THRESHOLD,
        gc_policy.GEN1_THRESHOLD,
        gc_policy.GEN2_THRESHOLD,
    )
    assert gc.get_freeze_count() == 0
