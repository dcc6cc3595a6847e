"""Prometheus /metrics: names, types, labels and counters that move.

Names and labels as vLLM's v1 engine logger declares them (vllm/v1/metrics/loggers.py):
engine metrics carry ``model_name`` and ``engine``; ``vllm:cache_config_info`` is a gauge
set to 1 with every cache setting as a label; ``vllm:lora_requests_info`` is a gauge whose
value is a Unix timestamp, set after an engine step when LoRA is configured.
"""

from __future__ import annotations

import time

import httpx

from tests.conformance.helpers import Prompts, Target, complete, scrape, wait_for

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
)
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
)


def _declared(text: str, name: str, kind: str) -> bool:
    lines = text.splitlines()
    return any(line.startswith(f"# HELP {name} ") for line in lines) and (
        f"# TYPE {name} {kind}" in lines
    )


async def test_every_metric_is_declared_and_labelled(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    await complete(client, target, prompts.text(20), max_tokens=3)
    metrics = await scrape(client)
    for kinds, names in (("gauge", GAUGES), ("counter", COUNTERS), ("histogram", HISTOGRAMS)):
        for name in names:
            assert _declared(metrics.text, name, kinds), f"{name}: no HELP/TYPE {kinds}"
    for name in GAUGES + COUNTERS:
        series = list(metrics.series(name))
        assert series, f"{name}: no samples"
        for labels, _ in series:
            assert labels.get("model_name") == target.model, (name, labels)
            assert "engine" in labels, (name, labels)
    usage = next(v for _, v in metrics.series("vllm:kv_cache_usage_perc"))
    assert 0.0 <= usage <= 1.0
    success = metrics.series("vllm:request_success_total")
    reasons = {lab.get("finished_reason") for lab, _ in success}
    assert "length" in reasons and "stop" in reasons


async def test_histograms_have_buckets_sum_and_count(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    await complete(client, target, prompts.text(20), max_tokens=4)
    metrics = await scrape(client)
    for name in HISTOGRAMS:
        buckets = list(metrics.series(f"{name}_bucket"))
        assert buckets, f"{name}: no buckets"
        assert all("le" in lab and lab.get("model_name") == target.model for lab, _ in buckets)
        assert any(lab["le"] == "+Inf" for lab, _ in buckets)
        assert list(metrics.series(f"{name}_sum")), f"{name}: no _sum"
        count = list(metrics.series(f"{name}_count"))
        assert count, f"{name}: no _count"
        inf = sum(v for lab, v in buckets if lab["le"] == "+Inf")
        assert inf == sum(v for _, v in count)
    assert metrics.value("vllm:e2e_request_latency_seconds_count") >= 1


async def test_cache_config_info(client: httpx.AsyncClient, target: Target) -> None:
    metrics = await scrape(client)
    assert _declared(metrics.text, "vllm:cache_config_info", "gauge")
    ((labels, value),) = metrics.series("vllm:cache_config_info")
    assert value == 1.0
    assert int(labels["block_size"]) == target.block_size
    assert int(labels["num_gpu_blocks"]) > 0
    assert labels["enable_prefix_caching"] == "True"
    assert "engine" in labels


async def test_lora_requests_info(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    assert target.lora is not None
    before = time.time()
    body = {"model": target.lora, "prompt": prompts.text(10), "max_tokens": 2, "ignore_eos": True}
    resp = await client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text

    async def newest() -> tuple[dict[str, str], float] | None:
        series = list((await scrape(client)).series("vllm:lora_requests_info"))
        return max(series, key=lambda s: s[1]) if series else None

    labels, stamp = await wait_for(newest, "vllm:lora_requests_info")
    assert set(labels) >= {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    assert int(labels["max_lora"]) >= 1
    assert stamp > before - 60
    metrics = await scrape(client)
    assert _declared(metrics.text, "vllm:lora_requests_info", "gauge")
    seen = [lab["running_lora_adapters"] for lab, _ in metrics.series("vllm:lora_requests_info")]
    assert any(target.lora in s.split(",") for s in seen), seen


async def test_counters_move_after_a_request(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    before = await scrape(client)
    out = await complete(client, target, prompts.text(30), max_tokens=5)
    usage = out["usage"]
    m = {"model_name": target.model}

    expected = {
        ("vllm:prompt_tokens_total", ()): usage["prompt_tokens"],
        ("vllm:generation_tokens_total", ()): 5,
        ("vllm:request_success_total", (("finished_reason", "length"),)): 1,
        ("vllm:prefix_cache_queries_total", ()): usage["prompt_tokens"],
        ("vllm:e2e_request_latency_seconds_count", ()): 1,
    }

    async def settled() -> bool:
        after = await scrape(client)
        return all(
            after.value(name, **m, **dict(labels)) - before.value(name, **m, **dict(labels)) == want
            for (name, labels), want in expected.items()
        )

    await wait_for(settled, "counters to move by exactly this request")
