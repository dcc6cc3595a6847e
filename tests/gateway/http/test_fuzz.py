"""Property: whatever a client puts in a completion body, the gateway answers 200 or vLLM's 4xx.

Arbitrary JSON values go in the fields the gateway reads (and a few it passes on), mixed with
typical ones so that requests also get past validation to the replicas; raw bytes and
non-object bodies too. Any 5xx is a gateway bug: the simulated replicas answer every request
they get with 200 or a 4xx, and the gateway must never crash on what it parses or hashes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from gateway.config import CacheIndexConfig
from simulator import SimFleet
from tests.gateway.conftest import LORA, MODEL, SIM, InProcessGateway, gateway_config, in_process
from tests.gateway.http.errors import vllm_error

# Fast replicas and a short context: any max_tokens above 256 is the replica's quick 400.
FUZZ_SIM = replace(SIM, max_model_len=256, time_scale=1000.0)
PATHS = ("/v1/completions", "/v1/chat/completions")


def json_values(ints: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    """Any JSON value (NaN and infinities too: not JSON, so the gateway must refuse them)."""
    scalars = st.none() | st.booleans() | ints | st.floats() | st.text(max_size=12)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=10,
    )


ANY = json_values(st.integers(min_value=-(2**70), max_value=2**70))
SMALL = json_values(st.integers(min_value=-3, max_value=3))


def typical_or_any(typical: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(typical, ANY)


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Each strategy `weight` times in `sum(weights)` (st.one_of dedups repeated strategies)."""
    return st.sampled_from([s for weight, s in choices for _ in range(weight)]).flatmap(lambda s: s)


def mostly(
    typical: st.SearchStrategy[Any], junk: st.SearchStrategy[Any] = ANY
) -> st.SearchStrategy[Any]:
    """Three times in four a typical value: a body gets past one field to the next."""
    return weighted((3, typical), (1, junk))


# Shapes near the valid ones (where a parser slips) as often as anything at all.
TOKEN_IDS = st.lists(st.integers(min_value=-1, max_value=2**32), max_size=8)
PROMPT = weighted(
    (1, st.text(max_size=40)),
    (1, st.lists(st.text(max_size=20), max_size=3)),
    (2, TOKEN_IDS),
    (1, st.lists(st.lists(st.integers(min_value=0, max_value=40_000), max_size=5), max_size=3)),
    (2, st.lists(ANY, min_size=1, max_size=4)),
    (2, st.lists(st.one_of(TOKEN_IDS, ANY), min_size=1, max_size=3)),
    (1, ANY),
)
PART = st.fixed_dictionaries(
    {"type": typical_or_any(st.sampled_from(["text", "image_url"]))},
    optional={"text": typical_or_any(st.text(max_size=20))},
)
CONTENT = mostly(st.text(max_size=40) | st.lists(typical_or_any(PART), max_size=3))
MESSAGE = mostly(
    st.fixed_dictionaries(
        {"role": typical_or_any(st.sampled_from(["system", "user", "assistant"]))},
        optional={"content": CONTENT},
    )
)
MESSAGES = mostly(st.lists(MESSAGE, min_size=1, max_size=3))
# Mostly a served model, so that most bodies get as far as their prompt or messages.
MODEL_NAME = weighted(
    (6, st.just(MODEL)), (1, st.just(LORA)), (1, st.sampled_from(["no-such-model", ""])), (1, ANY)
)
OTHER_FIELDS = {
    "max_tokens": mostly(st.integers(min_value=-2, max_value=300)),
    "stream": mostly(st.booleans()),
    "priority": mostly(st.integers(min_value=-(2**40), max_value=2**40)),
    "user": mostly(st.text(max_size=8)),
    "stream_options": mostly(
        st.fixed_dictionaries({}, optional={"include_usage": typical_or_any(st.booleans())})
    ),
    # The replica really generates each of n choices: ints stay small, any other value goes.
    "n": mostly(st.integers(min_value=-3, max_value=3), SMALL),
}
ALL_FIELDS = {"model": MODEL_NAME, "prompt": PROMPT, "messages": MESSAGES, **OTHER_FIELDS}


def bodies(path: str) -> st.SearchStrategy[bytes]:
    """Bodies for `path`: mostly objects with the fields it needs, else anything."""
    key = "prompt" if path == "/v1/completions" else "messages"
    needed = {"model": MODEL_NAME, key: ALL_FIELDS[key]}
    usual = st.fixed_dictionaries(needed, optional=OTHER_FIELDS)
    fields = st.fixed_dictionaries({}, optional=ALL_FIELDS)
    encoded = weighted((6, usual), (1, fields), (1, ANY)).map(lambda v: json.dumps(v).encode())
    return weighted((9, encoded), (1, st.binary(max_size=40)))


# Found before (issue 15): always tried first, whatever the generated examples come to.
KNOWN = [
    (PATHS[0], {"model": MODEL, "prompt": prompt})
    for prompt in ([None], [1.5], [[1, 2], None], [-1], [4294967296])
] + [(PATHS[1], {"model": MODEL, "messages": [{"role": "user", "content": [None, {"x": 1}]}]})]
REQUESTS = st.sampled_from(PATHS).flatmap(lambda path: st.tuples(st.just(path), bodies(path)))


@pytest.fixture
async def fuzz_gateway() -> AsyncIterator[InProcessGateway]:
    async with SimFleet(FUZZ_SIM, replicas=2, host="127.0.0.1", base_port=0) as fleet:
        # A tokenizer: token-id prompts are hashed, the harder path.
        cfg = gateway_config(fleet, cache_index=CacheIndexConfig(tokenizer="builtin"))
        async with in_process(cfg) as gw:
            yield gw


async def test_any_body_gets_200_or_a_vllm_4xx(fuzz_gateway: InProcessGateway) -> None:
    loop = asyncio.get_running_loop()
    client = fuzz_gateway.client
    headers = {"content-type": "application/json"}

    # Hypothesis drives a worker thread; each request runs on the test's loop, with the app.
    @settings(
        max_examples=150,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(request=REQUESTS)
    def check(request: tuple[str, bytes]) -> None:
        path, raw = request
        note(f"POST {path} {raw[:2000]!r}")
        post = client.post(path, content=raw, headers=headers)
        r = asyncio.run_coroutine_threadsafe(post, loop).result(timeout=30)
        if r.status_code != 200:
            assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
            vllm_error(r, r.status_code)

    for path, body in KNOWN:
        check = example(request=(path, json.dumps(body).encode()))(check)
    await asyncio.to_thread(check)
    assert all(rep.in_flight == 0 for rep in fuzz_gateway.runtime.pool)
