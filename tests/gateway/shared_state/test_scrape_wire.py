"""Scrape results on the wire, the order each process prefers replicas in, and what the leases
tell the score loop: pure, without Redis."""

from __future__ import annotations

import math
import time

import orjson
import pytest

from gateway.config import ReplicaConfig
from gateway.replicas.pool import ReplicaPool
from gateway.shared_state.config import SharedStateConfig
from gateway.shared_state.mirror import decode, decode_message, encode
from gateway.shared_state.scrapes import (
    ScrapeLeases,
    metrics_of,
    metrics_wire,
    preference,
    result_of,
)
from gateway.shared_state.scripts import Keys
from vllm_api.metrics import VllmMetrics

FULL = VllmMetrics(
    running=3.0,
    waiting=1.0,
    kv_usage=0.42,
    prefix_queries=1000.0,
    prefix_hits=600.0,
    preemptions=2.0,
    requests_ok=50.0,
    requests_failed=1.0,
    block_size=16,
    num_gpu_blocks=2048,
    running_adapters=frozenset({"lora-a", "lora-b"}),
    ttft_buckets={0.01: 3.0, 0.1: 40.0, math.inf: 51.0},
    itl_buckets={0.025: 100.0, math.inf: 120.0},
)


def test_a_scrapes_figures_survive_the_wire_whole() -> None:
    wire = orjson.loads(orjson.dumps(metrics_wire(FULL)))
    assert metrics_of(wire) == FULL
    assert metrics_of(orjson.loads(orjson.dumps(metrics_wire(VllmMetrics())))) == VllmMetrics()


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        "figures",
        [*metrics_wire(FULL)[:-1]],
        ["3", *metrics_wire(FULL)[1:]],
        [True, *metrics_wire(FULL)[1:]],
        [*metrics_wire(FULL)[:8], 16.5, *metrics_wire(FULL)[9:]],
        [*metrics_wire(FULL)[:10], "lora-a", *metrics_wire(FULL)[11:]],
        [*metrics_wire(FULL)[:11], [["nan", 1.0]], metrics_wire(FULL)[12]],
        [*metrics_wire(FULL)[:11], [[0.1, 1.0]], metrics_wire(FULL)[12]],
    ],
)
def test_malformed_figures_are_refused(raw: object) -> None:
    with pytest.raises(ValueError):
        metrics_of(raw)


def test_a_result_names_its_replica_version_and_plan() -> None:
    raw = ["r0", 1_700_000_000_000_000, 0.5, metrics_wire(FULL)]
    assert result_of(raw) == ("r0", 1_700_000_000_000_000, 0.5, FULL)
    for bad in (["r0", 1.5, 0.5, raw[3]], ["r0", 1, -1.0, raw[3]], [0, 1, 0.5, raw[3]], raw[:3]):
        with pytest.raises(ValueError):
            result_of(bad)


def test_results_ride_in_the_message_and_older_readers_ignore_them() -> None:
    result = ["r0", 7, 0.25, metrics_wire(FULL)]
    data = encode("p1", [], (), [result])
    assert decode_message(data) == ("p1", [], [], [result])
    assert decode(data) == ("p1", [], [])
    assert decode_message(encode("p1", []))[3] == []
    with pytest.raises(ValueError):
        decode_message(orjson.dumps({"o": "p1", "e": [], "s": {"r0": 1}}))


def test_each_process_prefers_the_replicas_in_its_own_order() -> None:
    names = [f"r{i}" for i in range(8)]
    orders = {pid: preference(pid, names) for pid in (f"host:{n}:ab" for n in range(6))}
    assert all(sorted(order) == names for order in orders.values())
    assert preference("host:0:ab", reversed(names)) == orders["host:0:ab"]  # deterministic
    # Different first choices: processes rarely reach for the same free lease.
    assert len({order[0] for order in orders.values()}) >= 3


def _leases(ttl: float = 1.0) -> tuple[ScrapeLeases, list[int]]:
    pool = ReplicaPool.from_configs([ReplicaConfig(url=f"http://r{i}.test:8000") for i in range(3)])
    woken: list[int] = []
    cfg = SharedStateConfig(url="redis://127.0.0.1:1/0", scrape_lease_ttl_s=ttl)
    return ScrapeLeases(cfg, Keys("t"), "p1", pool, lambda: woken.append(1)), woken


def test_the_leases_share_while_a_claim_is_younger_than_the_ttl() -> None:
    leases, woken = _leases()
    a, b = "r0.test:8000", "r1.test:8000"
    # No claim answered yet: nobody is known to scrape for this process, it scrapes all.
    assert not leases.sharing(0.0) and leases.scrapes(a, 0.0) and leases.scrapes(b, 0.0)
    leases.publish(a, 1, 0.25, FULL)
    assert leases.drain() == [] and woken == []
    leases.claimed([a.encode()], sent_at=100.0)
    assert leases.sharing(100.9) and leases.scrapes(a, 100.9) and not leases.scrapes(b, 100.9)
    # A claim a TTL old may have lapsed in Redis: back to scraping everything here.
    assert not leases.sharing(101.0) and leases.scrapes(b, 101.0)
    assert leases.claim_due(100.25) and not leases.claim_due(100.2)
    # Redis lost: the leases it granted stand until the claim's TTL, so they are kept to until
    # then (a late round trip must not send every process scraping everything at once).
    leases.lost()
    assert leases.sharing(100.5) and not leases.scrapes(b, 100.5)
    assert not leases.sharing(101.0) and leases.scrapes(a, 101.0) and leases.scrapes(b, 101.0)


def test_only_the_newest_result_per_replica_waits_for_the_flush() -> None:
    leases, woken = _leases(ttl=1e9)
    leases.claimed([b"r0.test:8000"], sent_at=time.monotonic())
    leases.publish("r0.test:8000", 1, 0.25, VllmMetrics(running=1.0))
    leases.publish("r0.test:8000", 2, math.inf, FULL)
    assert len(woken) == 2
    assert leases.drain() == [["r0.test:8000", 2, 0.0, metrics_wire(FULL)]]
    assert leases.drain() == [] and leases.stats.published == 1


def test_applied_stale_malformed_and_unknown_results_are_counted() -> None:
    leases, _ = _leases()
    seen: list[tuple[str, int]] = []

    def on_result(replica: object, version: int, _i: float, _m: VllmMetrics) -> bool:
        seen.append((getattr(replica, "name", ""), version))
        return version > 5

    leases.on_result = on_result
    wire = metrics_wire(FULL)
    r0, r1 = "r0.test:8000", "r1.test:8000"
    leases.apply([[r0, 9, 0.25, wire], [r1, 3, 0.25, wire], ["gone", 9, 0.25, wire]])
    leases.apply([[r0, "9", 0.25, wire]])
    assert seen == [("r0.test:8000", 9), ("r1.test:8000", 3)]
    s = leases.stats
    assert (s.applied, s.stale, s.unknown_replica, s.malformed) == (1, 1, 1, 1)
