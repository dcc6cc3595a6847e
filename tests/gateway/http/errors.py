"""Checks shared by the bad-input tests: vLLM's error body and the request counter."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.runtime import Runtime


def vllm_error(r: httpx.Response, status: int) -> dict[str, Any]:
    """The `error` object of `r`, checked to be vLLM's shape with `status` as its code."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == status
    return error


def requests_total(runtime: Runtime, **labels: str) -> float:
    """llm_gateway_requests_total summed over the series matching `labels`."""
    text = runtime.metrics.render().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "llm_gateway_requests"
        for sample in family.samples
        if sample.name == "llm_gateway_requests_total"
        and all(sample.labels.get(k) == v for k, v in labels.items())
    )
