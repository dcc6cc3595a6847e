"""Configuration loading: strict keys and types, documented defaults, routing profiles."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import GatewayConfig, ReplicaConfig, load_config, parse_config
from gateway.config_loader import ConfigError
from gateway.runtime import build_router

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"


def test_example_config_loads_and_documents_every_default() -> None:
    cfg = load_config(EXAMPLE)
    defaults = GatewayConfig()
    for section in (
        "server",
        "upstream",
        "health_check",
        "routing",
        "score_loop",
        "cache_index",
        "telemetry",
    ):
        assert getattr(cfg, section) == getattr(defaults, section), section
    assert cfg.replicas == (ReplicaConfig(url="http://127.0.0.1:8001", name="replica-0"),)
    # Every key of every section appears in the example (commented lines don't count).
    data = tomllib.loads(EXAMPLE.read_text())
    for section in (
        "server",
        "upstream",
        "health_check",
        "score_loop",
        "cache_index",
        "grpc",
        "telemetry",
    ):
        fields = {f.name for f in dataclasses.fields(getattr(defaults, section))}
        assert set(data[section]) == fields, section
    assert set(data["replicas"][0]) == {f.name for f in dataclasses.fields(ReplicaConfig)}


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
        ({"server": {"api_keys": "k"}}, "server.api_keys: expected array of string"),
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
