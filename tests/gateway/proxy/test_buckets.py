"""The admission bucket is named once, from [admission].buckets, and the queue places by it."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from gateway.config import AdmissionConfig, CacheIndexConfig
from gateway.proxy.admission import Admission
from gateway.proxy.affinity import Affinity
from gateway.proxy.requests import parse_request
from routing.types import Decision, RequestFeatures, Saturated
from vllm_api.tokenizer import BuiltinTokenizer


def _tokens(prompt: str) -> int:
    return len(BuiltinTokenizer().encode(prompt))


def _features(aff: Affinity, prompt: str, rid: str = "r") -> RequestFeatures:
    body = orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 1})
    return aff.features(parse_request("completions", body, rid), [])


@pytest.mark.parametrize(
    ("limits", "words", "expected"),
    [((), 300, "all"), ((8,), 3, "le8"), ((8,), 300, "gt8"), ((8, 1000), 300, "le1000")],
)
def test_features_carry_the_configured_bucket(
    limits: tuple[int, ...], words: int, expected: str
) -> None:
    aff = Affinity(CacheIndexConfig(tokenizer="builtin"), lambda m: False, buckets=limits)
    prompt = "word " * words
    f = _features(aff, prompt)
    assert f.prompt_tokens == _tokens(prompt)
    assert f.bucket == expected


def test_the_default_buckets_are_the_admission_defaults() -> None:
    aff = Affinity(CacheIndexConfig(tokenizer="builtin"), lambda m: False)
    assert aff.buckets == AdmissionConfig().buckets
    assert _features(aff, "hi").bucket == "le128"
    assert _features(aff, "word " * 2000).bucket == "gt512"


def test_a_failed_chat_template_still_gets_a_bucket_from_the_estimate() -> None:
    aff = Affinity(CacheIndexConfig(tokenizer="builtin"), lambda m: False, buckets=(4,))
    req = parse_request("completions", b'{"model": "m", "prompt": "' + b"x" * 400 + b'"}', "r")
    f = aff.lookup(req, [], None)  # no digest: what a template error leaves
    assert (f.prompt_tokens, f.bucket) == (100, "gt4")  # ~4 characters per token


async def test_the_queue_places_a_request_in_its_features_bucket() -> None:
    admission = Admission(AdmissionConfig(buckets=(8,)))
    saturated = Saturated("m", "all saturated")

    def route() -> Decision:
        raise saturated

    # The bucket the features name wins over the one their token count would give.
    features = RequestFeatures(model="m", request_id="r1", prompt_tokens=1, bucket="gt8")
    task = asyncio.create_task(admission.admit(features, route))
    deadline = asyncio.get_running_loop().time() + 5.0
    while len(admission.queue) == 0:  # tickets are keyed by admission's ids, not "r1"
        assert asyncio.get_running_loop().time() < deadline, "never queued"
        await asyncio.sleep(0.001)
    assert admission.queue.depth() == {("m", "le8"): 0, ("m", "gt8"): 1}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(admission.queue) == 0
