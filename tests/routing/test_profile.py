from __future__ import annotations

import math

import pytest

from routing import (
    BUILTIN_PROFILES,
    PluginConfigError,
    PluginSpec,
    ProfileSpec,
    Router,
    validate_profile,
)

OK_FILTERS = (PluginSpec("healthy"), PluginSpec("serves_model"))
OK_SCORERS = (PluginSpec("least_inflight"),)
OK_PICKER = PluginSpec("max_score")


def test_builtin_profiles_are_valid_and_named_by_key() -> None:
    expected = {"round_robin", "least_load", "random", "session", "prefix", "default"}
    assert expected <= set(BUILTIN_PROFILES)
    for key, profile in BUILTIN_PROFILES.items():
        assert profile.name == key
        validate_profile(profile)
        assert Router(profile).profile_name == key


def test_prefix_profile_plugins_and_weights() -> None:
    prefix = BUILTIN_PROFILES["prefix"]
    assert [f.type for f in prefix.filters] == [
        "healthy",
        "serves_model",
        "model_version",
        "saturation",
        "lora_affinity",
    ]
    assert [(s.type, s.weight) for s in prefix.scorers] == [
        ("least_inflight", 1.0),
        ("queue_load", 1.0),
        ("kv_utilization", 1.0),
        ("prefix_affinity", 2.0),
        ("token_load", 4.0),
    ]
    assert prefix.picker.type == "affinity_guard"


def test_default_is_the_prefix_profile() -> None:
    default, prefix = BUILTIN_PROFILES["default"], BUILTIN_PROFILES["prefix"]
    assert (default.filters, default.scorers, default.picker, default.affinity) == (
        prefix.filters,
        prefix.scorers,
        prefix.picker,
        prefix.affinity,
    )


def test_session_profile_balances_load_behind_the_guard() -> None:
    session = BUILTIN_PROFILES["session"]
    assert [s.type for s in session.scorers] == [
        "least_inflight",
        "queue_load",
        "kv_utilization",
        "token_load",
    ]
    assert session.picker.type == "affinity_guard"
    # Sessions only: with prefix holders or homes it would decide exactly as `default` does.
    assert session.picker.params["prefix_holders"] is False
    assert "prefix_holders" not in BUILTIN_PROFILES["default"].picker.params
    assert session.affinity == ("prompt_cache", "session")


def test_profiles_follow_every_tier_by_default_prompt_cache_first() -> None:
    assert ProfileSpec(OK_PICKER).affinity == ("prompt_cache", "session", "prefix_home")
    for key, profile in BUILTIN_PROFILES.items():
        if key != "session":
            assert profile.affinity == ProfileSpec(OK_PICKER).affinity, key


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (
            ProfileSpec(OK_PICKER, (PluginSpec("healty"),), OK_SCORERS, name="p"),
            r"profile 'p' filters\[0\]: unknown filter 'healty' "
            r"\(known: healthy, label, length_class, lora_affinity, model_version, saturation, "
            r"serves_model\)",
        ),
        (
            ProfileSpec(OK_PICKER, (PluginSpec("least_inflight"),), (), name="p"),
            r"filters\[0\]: 'least_inflight' is a scorer, it cannot be used as a filter",
        ),
        (
            ProfileSpec(OK_PICKER, OK_FILTERS, (PluginSpec("healthy"),), name="p"),
            r"scorers\[0\]: 'healthy' is a filter, it cannot be used as a scorer",
        ),
        (
            ProfileSpec(PluginSpec("weight"), OK_FILTERS, OK_SCORERS, name="p"),
            r"picker: 'weight' is a scorer, it cannot be used as a picker",
        ),
        (
            ProfileSpec(
                OK_PICKER, OK_FILTERS, (*OK_SCORERS, PluginSpec("least_inflight")), name="p"
            ),
            r"profile 'p': plugin 'least_inflight' appears twice",
        ),
        (
            ProfileSpec(OK_PICKER, (*OK_FILTERS, PluginSpec("healthy")), OK_SCORERS, name="p"),
            r"plugin 'healthy' appears twice",
        ),
        (
            ProfileSpec(OK_PICKER, OK_FILTERS, (PluginSpec("weight", -0.5),), name="p"),
            r"scorers\[0\]: weight of 'weight' must be finite and >= 0, got -0.5",
        ),
        (
            ProfileSpec(OK_PICKER, OK_FILTERS, (PluginSpec("weight", math.nan),), name="p"),
            r"weight of 'weight' must be finite",
        ),
        (
            ProfileSpec(OK_PICKER, (PluginSpec("healthy", 2.0),), (), name="p"),
            r"'healthy' is a filter; only scorers take a weight",
        ),
        (
            ProfileSpec(None, OK_FILTERS, OK_SCORERS, name="p"),  # type: ignore[arg-type]
            r"profile 'p': no picker",
        ),
        (
            ProfileSpec(
                PluginSpec("max_score", params={"sed": 1}), OK_FILTERS, OK_SCORERS, name="p"
            ),
            r"plugin 'max_score': unknown parameter 'sed'",
        ),
        (
            ProfileSpec(OK_PICKER, affinity=("session", "prompt"), name="p"),  # type: ignore[arg-type]
            r"profile 'p' affinity\[1\]: unknown tier 'prompt' "
            r"\(known: prefix_home, prompt_cache, session\)",
        ),
        (
            ProfileSpec(OK_PICKER, affinity=("session", "prompt_cache", "session"), name="p"),
            r"profile 'p' affinity: tier 'session' appears twice",
        ),
        # An unnamed profile (built in code, not from a config) is still located.
        (ProfileSpec(PluginSpec("weight")), r"^profile picker: 'weight' is a scorer"),
    ],
)
def test_invalid_profiles_are_rejected(profile: ProfileSpec, message: str) -> None:
    with pytest.raises(PluginConfigError, match=message):
        validate_profile(profile)
    with pytest.raises(PluginConfigError, match=message):
        Router(profile)


def test_zero_weight_scorer_is_allowed() -> None:
    validate_profile(ProfileSpec(OK_PICKER, OK_FILTERS, (PluginSpec("weight", 0.0),), name="p"))
