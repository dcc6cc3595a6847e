"""The PromQL and exposition readers the deploy tests rely on find what they must."""

from __future__ import annotations

import pytest

from tests.deploy.manifests import Selector, matches, parse_exposition, parse_promql


def test_selectors_functions_and_grouping_labels_are_told_apart() -> None:
    q = parse_promql(
        '(histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{job="g", m=~"x.*"}[2m])))'
        ' > 1e-3) or vector(0) + sum(b) / on(pod) group_left count(c{d!="1"})'
    )
    assert q.selectors == (
        Selector("a_seconds_bucket", {"job": ("=", "g"), "m": ("=~", "x.*")}),
        Selector("b"),
        Selector("c", {"d": ("!=", "1")}),
    )
    assert q.grouping_labels == {"le", "pod"}


def test_a_selector_without_a_name_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_promql('sum({job="g"})')


EXPOSITION = """\
# HELP h_seconds latency
# TYPE h_seconds histogram
h_seconds_bucket{model="m",le="0.1"} 1.0
h_seconds_sum{model="m"} 0.05
h_seconds_count{model="m"} 1.0
# HELP g_count a gauge whose name ends like a histogram's series
# TYPE g_count gauge
g_count{replica="r"} 2.0
# HELP c_total a counter
# TYPE c_total counter
c_total 3.0
"""


def test_series_suffixes_are_stripped_only_where_the_type_has_them() -> None:
    e = parse_exposition(EXPOSITION)
    assert e.family_of("h_seconds_bucket") == "h_seconds"
    assert e.family_of("h_seconds_count") == "h_seconds"
    assert e.family_of("h_seconds") is None  # a histogram is queried through its series
    assert e.family_of("g_count") == "g_count"
    assert e.family_of("g") is None
    assert e.family_of("c_total") == "c_total"
    assert e.family_of("c_total_count") is None
    assert ("h_seconds_bucket", {"model": "m", "le": "0.1"}) in e.samples


def test_matchers_follow_promql() -> None:
    labels = {"bucket": "gt512", "model": "m"}
    assert matches(labels, {"bucket": ("=~", "gt.*"), "model": ("=", "m")})
    assert not matches(labels, {"bucket": ("=~", "le.*")})
    assert not matches(labels, {"bucket": ("=~", "gt")})  # anchored, as in PromQL
    assert matches(labels, {"tenant": ("!=", "x")})
