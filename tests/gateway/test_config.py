"""Configuration loading: strict keys and types, documented defaults, routing profiles."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.config import GatewayConfig, ReplicaConfig, parse_config
from gateway.config_loader import ConfigError
from gateway.runtime import build_router
from routing import ReplicaSnapshot, RequestFeatures

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"


# Keys of the example that show a sample rather than document a default, checked on their own:
# the sample replica (its url and name are the example's; every other key is at its default)
# and user profiles (none by default; the example's is commented out).
SAMPLES = ("replicas", "routing.profiles")


def _undocumented(
    default: object, loaded: object, table: Mapping[str, Any], path: str
) -> list[str]:
    """Every field of dataclass `default` missing from `table` or documented at another value."""
    problems: list[str] = []
    for f in dataclasses.fields(default):  # type: ignore[arg-type]
        key = f"{path}.{f.name}" if path else f.name
        want, got = getattr(default, f.name), getattr(loaded, f.name)
        if key in SAMPLES:
            continue
        if f.name not in table:
            problems.append(f"{key}: missing from the example")
        elif dataclasses.is_dataclass(want):
            problems += _undocumented(want, got, table[f.name], key)
        elif got != want:
            problems.append(f"{key}: the example has {got!r}, the default is {want!r}")
    return problems


def example_problems(text: str) -> list[str]:
    """What keeps an example config from documenting every default, one line per key path."""
    data = tomllib.loads(text)
    cfg = parse_config(data)
    problems = _undocumented(GatewayConfig(), cfg, data, "")
    if not cfg.replicas:
        problems.append("replicas: the example has no [[replicas]] table")
    for i, (replica, table) in enumerate(zip(cfg.replicas, data.get("replicas", ()), strict=True)):
        sample = ReplicaConfig(url=replica.url, name=replica.name)
        problems += _undocumented(sample, replica, table, f"replicas[{i}]")
    if cfg.routing.profiles:
        build_router(cfg)  # a profile shown in the example must build
    return problems


def test_example_config_loads_and_documents_every_default() -> None:
    assert example_problems(EXAMPLE.read_text()) == []


def test_an_undocumented_or_changed_default_is_named_by_its_key_path() -> None:
    text = EXAMPLE.read_text()
    edits = [
        (r"^long_share = .*\n", ""),  # [admission]
        (r"^max_depth = 1024\b", "max_depth = 7"),  # [admission]
        (r"^kv_events = .*\n", ""),  # [[replicas]]
        (r"^keepalive_permit_without_calls = false", "keepalive_permit_without_calls = true"),
    ]
    for pattern, replacement in edits:
        text, n = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
        assert n == 1, pattern
    assert example_problems(text) == [
        "admission.max_depth: the example has 7, the default is 1024",
        "admission.long_share: missing from the example",
        "grpc.keepalive_permit_without_calls: the example has True, the default is False",
        "replicas[0].kv_events: missing from the example",
    ]


def test_the_commented_example_profile_builds() -> None:
    lines = EXAMPLE.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("# [routing.profiles."))
    block = [lines[first][2:]]
    for line in lines[first + 1 :]:
        if not re.match(r"# \w+ = ", line):
            break
        block.append(line[2:])
    profiles = tomllib.loads("\n".join(block))["routing"]["profiles"]
    (name,) = profiles
    cfg = parse_config({"routing": {"profile": name, "profiles": profiles}})
    assert build_router(cfg).profile_name == name
    assert example_problems(EXAMPLE.read_text() + "\n".join(block) + "\n") == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"server": {"prot": 1}}, "server.prot: unknown key"),
        ({"bogus": {}}, "bogus: unknown key"),
        ({"server": {"port": "80"}}, "server.port: expected integer, got str"),
        ({"server": {"port": True}}, "server.port: expected integer, got bool"),
        ({"upstream": {"idle_timeout_s": "x"}}, "upstream.idle_timeout_s: expected number"),
        ({"upstream": {"idle_timeout_s": 0}}, "idle_timeout_s must be > 0"),
        ({"replicas": [{"name": "a"}]}, "replicas[0].url: missing required key"),
        ({"replicas": [{"url": "ftp://x"}]}, "url must be http(s)"),
        ({"replicas": [{"url": "http://a:1", "wieght": 2}]}, "replicas[0].wieght: unknown key"),
        (
            {"replicas": [{"url": "http://a:1", "name": "r"}, {"url": "http://b:1", "name": "r"}]},
            "duplicate replica names: r",
        ),
        ({"routing": {"profiles": {"p": {"filters": []}}}}, "routing.profiles.p.picker: missing"),
        (
            {
                "routing": {
                    "profiles": {"p": {"picker": {"type": "random"}, "affinity": ["sesion"]}}
                }
            },
            "routing.profiles.p.affinity[0]: expected one of 'prompt_cache', 'session', "
            "'prefix_home', got 'sesion'",
        ),
        (
            {"routing": {"profiles": {"p": {"picker": {"type": "random"}, "name": "q"}}}},
            "routing: profiles.p.name must be 'p', not 'q'",
        ),
        ({"server": {"api_keys": "k"}}, "server.api_keys: expected array of string"),
        ({"server": {"admin_keys": "k"}}, "server.admin_keys: expected array of string"),
        (
            {"server": {"api_keys": ["k"], "admin_keys": ["k"]}},
            "admin_keys must not repeat a key of api_keys",
        ),
    ],
)
def test_strict_loading_names_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert message in str(info.value)


def test_replica_name_defaults_to_host_port() -> None:
    cfg = parse_config({"replicas": [{"url": "http://10.0.0.1:8001/"}]})
    assert cfg.replicas[0].name == "10.0.0.1:8001"
    assert cfg.replicas[0].url == "http://10.0.0.1:8001"


def test_user_profile_is_built_and_plugin_errors_name_the_profile() -> None:
    cfg = parse_config(
        {
            "routing": {
                "profile": "mine",
                "profiles": {
                    "mine": {
                        "filters": [{"type": "healthy"}],
                        "scorers": [{"type": "least_inflight", "weight": 2.0}],
                        "picker": {"type": "max_score", "params": {"seed": 1}},
                    }
                },
            }
        }
    )
    assert build_router(cfg).profile_name == "mine"
    assert cfg.routing.profiles["mine"].affinity == ("prompt_cache", "session", "prefix_home")
    bad = parse_config(
        {
            "routing": {
                "profile": "bad",
                "profiles": {"bad": {"filters": [{"type": "nope"}], "picker": {"type": "random"}}},
            }
        }
    )
    with pytest.raises(ConfigError, match=r"routing.profiles.bad: .*unknown filter 'nope'"):
        build_router(bad)
    with pytest.raises(ConfigError, match=r"routing\.profile: unknown profile 'zzz'"):
        build_router(parse_config({"routing": {"profile": "zzz"}}))


def test_a_profile_orders_its_affinity_tiers() -> None:
    table = {"picker": {"type": "affinity_guard", "params": {"seed": 0}}}
    profiles = {
        "sessions_first": {**table, "affinity": ["session", "prompt_cache"]},
        "twice": {**table, "affinity": ["session", "session"]},
    }
    cfg = parse_config({"routing": {"profile": "sessions_first", "profiles": profiles}})
    assert cfg.routing.profiles["sessions_first"].affinity == ("session", "prompt_cache")
    assert cfg.routing.profiles["sessions_first"].name == "sessions_first"
    router = build_router(cfg)
    request = RequestFeatures(model="m", prompt_cache_replica="a", session_replica="b")
    fleet = [ReplicaSnapshot(n, f"http://{n}", frozenset({"m"})) for n in "ab"]
    assert router.route(request, fleet).replica.name == "b"
    twice = parse_config({"routing": {"profile": "twice", "profiles": profiles}})
    with pytest.raises(
        ConfigError, match=r"routing\.profiles\.twice: .*tier 'session' appears twice"
    ):
        build_router(twice)


def test_check_config_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(EXAMPLE)]) == 0
    assert "OK (1 replicas" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nport = 'x'\n")
    assert main(["check-config", str(bad)]) == 2
    assert "server.port: expected integer" in capsys.readouterr().err
    broken = tmp_path / "broken.toml"
    broken.write_text("[server\n")
    assert main(["check-config", str(broken)]) == 2
    assert "invalid TOML" in capsys.readouterr().err
