"""Parsing vLLM's exposition: current names, old-name fallback, info series, histogram deltas."""
# ruff: noqa: E501 - exposition lines are long by nature

from __future__ import annotations

import pytest

from vllm_api.metrics import parse_vllm_metrics, quantile_from_deltas

CURRENT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_waiting{model_name="m",engine="0"} 2.0
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25
vllm:prefix_cache_queries_total{model_name="m",engine="0"} 1000.0
vllm:prefix_cache_hits_total{model_name="m",engine="0"} 640.0
vllm:request_success_total{model_name="m",engine="0",finished_reason="length"} 7.0
vllm:request_success_total{model_name="m",engine="0",finished_reason="stop"} 3.0
vllm:request_success_total{model_name="m",engine="0",finished_reason="abort"} 5.0
vllm:request_success_total{model_name="m",engine="0",finished_reason="error"} 1.0
vllm:time_to_first_token_seconds_bucket{model_name="m",engine="0",le="0.1"} 4.0
vllm:time_to_first_token_seconds_bucket{model_name="m",engine="0",le="0.5"} 9.0
vllm:time_to_first_token_seconds_bucket{model_name="m",engine="0",le="+Inf"} 10.0
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",num_gpu_blocks="4096",engine="0"} 1.0
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 1700000000.0
vllm:lora_requests_info{max_lora="4",running_lora_adapters="c",waiting_lora_adapters="d"} 1700000005.0
"""

OLD = """vllm:num_requests_running{model_name="m"} 1.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:gpu_prefix_cache_queries_total{model_name="m"} 10.0
vllm:gpu_prefix_cache_hits_total{model_name="m"} 4.0
vllm:time_per_output_token_seconds_bucket{model_name="m",le="0.01"} 2.0
vllm:time_per_output_token_seconds_bucket{model_name="m",le="+Inf"} 2.0
"""


def test_current_names() -> None:
    m = parse_vllm_metrics(CURRENT)
    assert (m.running, m.waiting, m.kv_usage) == (3.0, 2.0, 0.25)
    assert (m.prefix_queries, m.prefix_hits) == (1000.0, 640.0)
    assert (m.requests_ok, m.requests_failed) == (10.0, 1.0)  # aborts are clients leaving
    assert (m.block_size, m.num_gpu_blocks) == (16, 4096)
    assert m.running_adapters == frozenset({"c"})  # the newest series wins
    assert m.ttft_buckets == {0.1: 4.0, 0.5: 9.0, float("inf"): 10.0}


def test_old_names_are_a_fallback() -> None:
    m = parse_vllm_metrics(OLD)
    assert (m.running, m.waiting, m.kv_usage) == (1.0, None, 0.5)
    assert (m.prefix_queries, m.prefix_hits) == (10.0, 4.0)
    assert m.itl_buckets == {0.01: 2.0, float("inf"): 2.0}
    both = parse_vllm_metrics(OLD + CURRENT)
    assert both.kv_usage == 0.25


def test_escaped_labels_and_garbage_lines() -> None:
    text = (
        'vllm:cache_config_info{block_size="32",x="a\\"b,c",num_gpu_blocks="7"} 1\n'
        "vllm:bad\nvllm:num_requests_waiting{} nan-ish\n"
    )
    m = parse_vllm_metrics(text)
    assert (m.block_size, m.num_gpu_blocks, m.waiting) == (32, 7, None)


@pytest.mark.parametrize(
    ("before", "q", "expected"),
    [
        ({}, 0.5, 0.1 + 0.4 * (5 - 4) / 5),  # rank 5 falls in (0.1, 0.5]
        ({}, 0.1, 0.1 * 1 / 4),
        ({0.1: 4.0, 0.5: 9.0, float("inf"): 10.0}, 0.5, None),  # nothing new in the window
        ({0.1: 4.0, 0.5: 4.0, float("inf"): 4.0}, 0.99, 0.5),  # only slow requests since
    ],
)
def test_quantile_from_histogram_deltas(
    before: dict[float, float], q: float, expected: float | None
) -> None:
    now = parse_vllm_metrics(CURRENT).ttft_buckets
    got = quantile_from_deltas(now, before, q)
    assert got == pytest.approx(expected) if expected is not None else got is None
