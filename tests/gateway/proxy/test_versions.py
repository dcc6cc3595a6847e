"""The traffic stage: versions bound before routing, classes relabelled, priority passed on."""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.config import GatewayConfig, ReplicaConfig, RoutingConfig, parse_config
from gateway.config_loader import ConfigError
from gateway.errors import BadRequest
from gateway.grpc.convert import read_hints
from gateway.proxy import hints
from gateway.proxy.requests import ParsedRequest, parse_request
from gateway.proxy.versions import VLLM_PRIORITY_HEADER, Traffic
from gateway.versions_config import ModelVersionsConfig, TrafficConfig
from routing import ReplicaSnapshot
from routing.profile import BUILTIN_PROFILES, PluginSpec
from routing.types import Branch, Decision, RequestFeatures
from routing.versions import Version

EXAMPLE = Path(__file__).resolve().parents[3] / "config.example.toml"
MODEL = "llama"
VERSIONS = ModelVersionsConfig(
    MODEL,
    (
        Version("v1", 90, "stable", labels={"version": "v1"}),
        Version("v2", 10, "initial", served_model="llama-v2"),
    ),
)


def _req(headers: list[tuple[bytes, bytes]] | None = None, **body: Any) -> ParsedRequest:
    data = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}
    req = parse_request("chat", orjson.dumps(data), "r1")
    return hints.apply(req, hints.from_headers(headers or []))


def _traffic(
    counted: list[tuple[str, str]] | None = None, **traffic: Any
) -> tuple[Traffic, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = [] if counted is None else counted
    cfg = GatewayConfig(traffic=TrafficConfig(model_versions=(VERSIONS,), **traffic))
    return Traffic(cfg, lambda m, v: seen.append((m, v))), seen


def test_versions_split_by_weight_and_are_counted() -> None:
    traffic, seen = _traffic()
    got: Counter[str] = Counter()
    for _ in range(2000):
        req = traffic.choose(_req(), [])
        got[req.model] += 1
    assert abs(got["llama-v2"] / 2000 - 0.10) <= 0.03, got
    assert Counter(v for _, v in seen) == {"v1": got[MODEL], "v2": got["llama-v2"]}
    assert {m for m, _ in seen} == {MODEL}


def test_a_labelled_version_restricts_and_a_served_one_rewrites_the_body() -> None:
    traffic, _ = _traffic(allow_canary_header=True)
    v1 = traffic.choose(_req([(b"x-canary-weight", b"0")], max_tokens=4), [])
    assert v1.features.version_labels == {"version": "v1"} and v1.model == MODEL
    assert orjson.loads(v1.body)["model"] == MODEL
    v2 = traffic.choose(_req([(b"x-canary-weight", b"100")], max_tokens=4), [])
    assert (v2.model, v2.features.model, v2.features.version_labels) == ("llama-v2",) * 2 + ({},)
    assert orjson.loads(v2.body) == {**orjson.loads(v1.body), "model": "llama-v2"}
    assert v2.data["model"] == "llama-v2"


def test_other_models_pass_untouched() -> None:
    traffic, seen = _traffic()
    req = _req(model="mistral")
    assert traffic.choose(req, []) is req and not seen


def test_a_session_stays_on_its_version() -> None:
    traffic, _ = _traffic()
    for i in range(200):
        header = [(b"x-session-id", f"conv-{i}".encode())]
        first = traffic.choose(_req(), header).model
        assert all(traffic.choose(_req(), header).model == first for _ in range(5))
        # The body's `user` is a session key too.
        by_user = traffic.choose(_req(user=f"u{i}"), []).model
        assert all(traffic.choose(_req(user=f"u{i}"), []).model == by_user for _ in range(3))


@pytest.mark.parametrize(
    ("traffic_cfg", "tenant", "honoured"),
    [
        ({}, None, False),  # off by default
        ({"allow_canary_header": True}, None, True),
        ({"allow_canary_header": True, "canary_header_tenants": ("ops",)}, "ops", True),
        ({"allow_canary_header": True, "canary_header_tenants": ("ops",)}, "acme", False),
        ({"allow_canary_header": True, "canary_header_tenants": ("ops",)}, None, False),
        ({"allow_canary_header": True, "canary_header_tenants": ("default",)}, None, True),
    ],
)
def test_the_canary_header_counts_only_when_allowed(
    traffic_cfg: dict[str, Any], tenant: str | None, honoured: bool
) -> None:
    traffic, _ = _traffic(**traffic_cfg)
    models: Counter[str] = Counter()
    for _ in range(300):
        req = _req([(b"x-canary-weight", b"100")])
        req = replace(req, features=replace(req.features, tenant=tenant))
        models[traffic.choose(req, []).model] += 1
    if honoured:
        assert models == {"llama-v2": 300}
    else:
        assert 0 < models["llama-v2"] < 60, models


@pytest.mark.parametrize("value", [b"101", b"-1", b"x", b"1.5", b"\xd9\xa3"])
def test_a_malformed_canary_weight_is_a_bad_request(value: bytes) -> None:
    with pytest.raises(BadRequest, match="x-canary-weight"):
        hints.from_headers([(b"x-canary-weight", value)])


def test_x_llm_priority_is_an_alias_of_x_priority() -> None:
    assert hints.from_headers([(b"x-llm-priority", b"P0")]).priority == 0
    assert hints.from_headers([(b"x-llm-priority", b"p2"), (b"x-priority", b"2")]).priority == 2
    assert read_hints((("x-llm-priority", "P1"), ("x-canary-weight", "7"))).priority == 1
    assert read_hints((("x-canary-weight", "7"),)).canary_weight == 7
    with pytest.raises(BadRequest, match="disagree"):
        hints.from_headers([(b"x-llm-priority", b"P0"), (b"x-priority", b"P2")])
    with pytest.raises(BadRequest, match="x-llm-priority"):
        hints.from_headers([(b"x-llm-priority", b"high")])


def _replica(**config: Any) -> ReplicaConfig:
    return ReplicaConfig(url="http://r:1", name="r", **config)


@pytest.mark.parametrize(
    ("priority", "marked", "body_priority", "header"),
    [
        (0, True, 0, "0"),
        (2, True, 2, "2"),
        (-5, True, 0, "0"),  # clamped to the classes (no tenancy)
        (2, False, None, None),  # a FCFS replica never sees a priority
        (0, False, 0, None),  # ...but a 0 (vLLM's default) goes as it came
    ],
)
def test_priority_reaches_only_replicas_that_schedule_by_it(
    priority: int, marked: bool, body_priority: int | None, header: str | None
) -> None:
    traffic, _ = _traffic()
    req = _req(priority=priority)
    headers = {VLLM_PRIORITY_HEADER: "-100", "x-other": "1"}  # a client's own: never kept
    body = traffic.upstream_body(req, _replica(priority_scheduling=marked), headers)
    sent = orjson.loads(body)
    assert sent.get("priority") == body_priority
    assert headers.get(VLLM_PRIORITY_HEADER) == header and headers["x-other"] == "1"
    assert {k: v for k, v in sent.items() if k != "priority"} == {
        k: v for k, v in req.data.items() if k != "priority"
    }


def test_the_class_comes_from_tenancy_when_there_is_one() -> None:
    cfg = GatewayConfig()
    traffic = Traffic(cfg, lambda m, v: None, priority_of=lambda f: 1)
    headers: dict[str, str] = {}
    body = traffic.upstream_body(_req(), _replica(priority_scheduling=True), headers)
    assert orjson.loads(body)["priority"] == 1 and headers[VLLM_PRIORITY_HEADER] == "1"
    # Already the class: the body goes byte for byte.
    req = _req(priority=1)
    assert traffic.upstream_body(req, _replica(priority_scheduling=True), {}) is req.body
    plain = _req()
    assert traffic.upstream_body(plain, _replica(), {}) is plain.body


ONE = {"name": "a", "weight": 100}


def _decision(labels: dict[str, str]) -> Decision:
    snap = ReplicaSnapshot(name="r", url="http://r:1", models=frozenset({MODEL}), labels=labels)
    return Decision(replica=snap, branch=Branch.MISS_BY_LOAD, total=0.0, scores={}, candidates=1)


def test_a_decision_outside_the_class_is_labelled_class_fallback() -> None:
    default = BUILTIN_PROFILES["default"]
    profile = replace(
        default,
        name="classes",
        filters=(*default.filters, PluginSpec("length_class", params={"min_prompt_tokens": 10})),
    )
    cfg = GatewayConfig(routing=RoutingConfig(profile="classes", profiles={"classes": profile}))
    traffic = Traffic(cfg, lambda m, v: None)
    long, short = RequestFeatures(MODEL, prompt_tokens=11), RequestFeatures(MODEL, prompt_tokens=5)
    cls = {"class": "long-context"}
    assert traffic.relabel(long, _decision({})).branch is Branch.CLASS_FALLBACK
    assert traffic.relabel(long, _decision(cls)).branch is Branch.MISS_BY_LOAD
    assert traffic.relabel(short, _decision({})).branch is Branch.MISS_BY_LOAD
    assert traffic.relabel(short, _decision(cls)).branch is Branch.CLASS_FALLBACK
    # A profile without the filter: never a fallback.
    plain = Traffic(GatewayConfig(), lambda m, v: None)
    assert plain.relabel(long, _decision({})).branch is Branch.MISS_BY_LOAD


@pytest.mark.parametrize(
    ("traffic", "message"),
    [
        (
            {"model_versions": [{"model": "m", "versions": [{"name": "a", "weight": 90}]}]},
            "sum to 100",
        ),
        (
            {"model_versions": [{"model": "m", "versions": [{**ONE, "stage": "beta"}]}]},
            "stage: expected one of",
        ),
        (
            {"model_versions": [{"model": "m", "versions": [ONE]}] * 2},
            "m appear more than once",
        ),
        (
            {"model_versions": [{"model": "m", "versions": [{**ONE, "served_model": "m"}]}]},
            "repeats the public name",
        ),
        ({"canary_header_tenants": ["_other"]}, "not a tenant name"),
        ({"canary_weight": 3}, "traffic.canary_weight: unknown key"),
    ],
)
def test_bad_traffic_tables_are_refused(traffic: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"traffic": traffic})


def test_labelled_versions_need_the_version_filter_in_the_profile() -> None:
    versions = {
        "model": "m",
        "versions": [
            {"name": "a", "weight": 50, "labels": {"v": "a"}},
            {"name": "b", "weight": 50, "stage": "initial", "labels": {"v": "b"}},
        ],
    }
    bare = {"picker": {"type": "random"}, "filters": [{"type": "healthy"}]}
    with pytest.raises(ConfigError, match="'model_version' filter in routing profile 'bare'"):
        parse_config(
            {
                "traffic": {"model_versions": [versions]},
                "routing": {"profile": "bare", "profiles": {"bare": bare}},
            }
        )
    assert parse_config({"traffic": {"model_versions": [versions]}}).traffic.labelled


def test_the_commented_example_versions_load() -> None:
    text = EXAMPLE.read_text()
    start = text.index("# [[traffic.model_versions]]")
    lines = []
    for line in text[start:].splitlines():
        if not line.startswith("#"):
            break
        lines.append(re.sub(r"^# ?", "", line))
    cfg = parse_config(tomllib.loads("\n".join(lines)))
    (model,) = cfg.traffic.model_versions
    assert [(v.name, v.weight, v.stage) for v in model.versions] == [
        ("v1", 90, "stable"),
        ("v2", 10, "initial"),
    ]


def test_a_body_that_is_not_the_json_of_its_data_is_never_rewritten() -> None:
    traffic, seen = _traffic(allow_canary_header=True)
    # A route of another kind (a multipart upload, say): only the header carries the class.
    other = replace(_req([(b"x-canary-weight", b"100")], priority=2), kind="audio")  # type: ignore[arg-type]
    assert traffic.choose(other, []) is other and not seen
    headers: dict[str, str] = {}
    assert traffic.upstream_body(other, _replica(priority_scheduling=True), headers) is other.body
    assert headers[VLLM_PRIORITY_HEADER] == "2"
    assert traffic.upstream_body(other, _replica(), {}) is other.body
