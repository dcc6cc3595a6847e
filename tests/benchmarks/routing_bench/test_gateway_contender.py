import tomllib
from pathlib import Path

import httpx
import pytest

from benchmarks.routing_bench.contenders import FleetInfo
from benchmarks.routing_bench.gateway_contender import (
    BUILTIN_MODES,
    GatewayContender,
    GatewayMode,
    gateway_contenders,
    gateway_toml,
    same_as_default,
)
from benchmarks.routing_bench.suite import custom_modes, variant_modes
from gateway.config import parse_config
from gateway.runtime import build_router
from simulator import SimConfig, SimFleet

FLEET = FleetInfo(
    urls=("http://127.0.0.1:9001", "http://127.0.0.1:9002"),
    model="sim-llama-3-8b",
    kv_endpoints=("tcp://127.0.0.1:7001", None),
    tokenizer="builtin",
    block_size=16,
    fleet="sim",
)


@pytest.mark.parametrize("mode", BUILTIN_MODES, ids=lambda m: m.label)
def test_generated_config_is_valid_for_the_gateway(mode: GatewayMode) -> None:
    cfg = parse_config(tomllib.loads(gateway_toml(mode, FLEET, "127.0.0.1", 8123)))
    assert build_router(cfg).profile_name == mode.profile
    assert cfg.server.port == 8123
    assert [r.url for r in cfg.replicas] == list(FLEET.urls)
    if mode.precise:
        assert [r.kv_events for r in cfg.replicas] == ["tcp://127.0.0.1:7001", "auto"]
        assert (cfg.cache_index.tokenizer, cfg.cache_index.block_size) == ("builtin", 16)
    else:
        assert all(r.kv_events == "" for r in cfg.replicas)
        assert cfg.cache_index.tokenizer == ""


def test_every_profile_the_issue_names_is_a_contender() -> None:
    names = [c.name for c in gateway_contenders()]
    # The approximate prefix profile is the default: it runs once, as gateway:default.
    assert same_as_default("prefix")
    labels = ("round_robin", "least_load", "session", "precise", "default")
    assert names == [f"gateway:{x}" for x in labels]
    assert [c.name for c in gateway_contenders(["default"])] == ["gateway:default"]
    assert [c.name for c in gateway_contenders(["prefix"])] == ["gateway:prefix"]


def test_custom_profiles_run_approximate_and_precise(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        '[routing.profiles.sticky]\nfilters = [{ type = "healthy" }]\n'
        'scorers = [{ type = "least_inflight", weight = 1.0 }]\n'
        'picker = { type = "affinity_guard", params = { guard_ratio = 2.0 } }\n'
    )
    modes = custom_modes(path)
    assert [(m.label, m.precise) for m in modes] == [("sticky", False), ("sticky+kv", True)]
    cfg = parse_config(tomllib.loads(gateway_toml(modes[1], FLEET, "127.0.0.1", 1)))
    assert build_router(cfg).profile_name == "sticky"


def test_variants_run_one_gateway_config_each(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    path.write_text(
        '[variants.slow]\ntoml = """\n[score_loop]\nscrape_interval_s = 1.0\n"""\n'
        '[variants.kv]\nprofile = "prefix"\nprecise = true\n'
    )
    modes = variant_modes(path)
    assert [(m.label, m.profile, m.precise) for m in modes] == [
        ("kv", "prefix", True),
        ("slow", "default", False),
    ]
    cfg = parse_config(tomllib.loads(gateway_toml(modes[1], FLEET, "127.0.0.1", 1)))
    assert cfg.score_loop.scrape_interval_s == 1.0
    assert build_router(cfg).profile_name == "default"
    path.write_text("[variants.bad]\nprofiles = 1\n")
    with pytest.raises(ValueError, match=r"variants\.bad: unknown keys profiles"):
        variant_modes(path)


def test_variants_name_workers_hosts_and_shared_state(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    path.write_text(
        "[variants.w2]\nworkers = 2\nshared_state = true\n"
        '[variants.two_hosts]\nworkers = 4\nhosts = 2\nsource = "/tmp/before"\n'
    )
    modes = variant_modes(path)
    assert [(m.label, m.workers, m.hosts, m.shared_state, m.source) for m in modes] == [
        ("two_hosts", 4, 2, False, "/tmp/before"),
        ("w2", 2, 1, True, ""),
    ]
    cfg = parse_config(
        tomllib.loads(gateway_toml(modes[1], FLEET, "127.0.0.1", 1, "redis://127.0.0.1:7/0"))
    )
    assert cfg.shared_state.url == "redis://127.0.0.1:7/0"
    assert parse_config(tomllib.loads(gateway_toml(modes[0], FLEET, "h", 1))).shared_state.url == ""
    # A variant's own [shared_state] table is completed with the url, not repeated.
    tuned = GatewayMode("t", "default", extra_toml="[shared_state]\ninflight_poll_s = 0.01\n")
    cfg = parse_config(tomllib.loads(gateway_toml(tuned, FLEET, "h", 1, "redis://r:1/0")))
    assert (cfg.shared_state.url, cfg.shared_state.inflight_poll_s) == ("redis://r:1/0", 0.01)
    for workers, hosts in ((3, 2), (1, 2), (2, 0)):
        with pytest.raises(ValueError, match="multiple of hosts"):
            GatewayMode("bad", "default", workers=workers, hosts=hosts)


@pytest.mark.parametrize("shared", [False, True], ids=["alone", "redis"])
async def test_two_hosts_are_two_listeners_over_one_fleet(shared: bool) -> None:
    """Real processes: two `serve` on 127.0.0.1 and 127.0.0.2 (and a real Redis when shared)."""
    async with SimFleet(SimConfig(model=FLEET.model, time_scale=50.0), replicas=2) as fleet:
        info = FleetInfo(
            tuple(r.url for r in fleet.replicas), FLEET.model, (None, None), "builtin", 16, "sim"
        )
        contender = GatewayContender(
            GatewayMode("h2", "default", workers=2, hosts=2, shared_state=shared)
        )
        try:
            urls = (await contender.start(info)).split(",")
            assert [u.rsplit(":", 1)[0] for u in urls] == ["http://127.0.0.1", "http://127.0.0.2"]
            assert len(contender.pids()) == 2 + shared  # two gateways (and the Redis)
            body = {"model": FLEET.model, "prompt": "hello", "max_tokens": 2}
            async with httpx.AsyncClient(timeout=10.0) as client:
                for url in urls:
                    resp = await client.post(f"{url}/v1/completions", json=body)
                    assert resp.status_code == 200, resp.text
        finally:
            await contender.stop()
        assert contender.pids() == []
