"""A new prefix sent twice at once goes to one replica: the second follows the first in flight."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import orjson

from gateway.config import GatewayConfig, RoutingConfig
from gateway.proxy.requests import ParsedRequest, parse_request
from routing import BUILTIN_PROFILES
from tests.gateway.fake_upstream import (
    Answer,
    FakeUpstream,
    PipelineRig,
    pipeline_rig,
    replica_configs,
)

MODEL = "m"


def chat(group: int, question: str) -> ParsedRequest:
    system = f"Group {group} handbook. " + " ".join(f"rule-{group}-{i}." for i in range(60))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    body = {"model": MODEL, "messages": messages, "stream": True}
    return parse_request("chat", orjson.dumps(body), f"rid-{group}-{question}")


async def hung(r: PipelineRig) -> None:
    """Until one more request hangs upstream (each open runs to its send, then waits)."""
    await asyncio.wait_for(r.upstream.waiting.wait(), timeout=5.0)
    r.upstream.waiting.clear()


async def test_a_new_prefix_sent_twice_at_once_goes_to_one_replica() -> None:
    r = pipeline_rig(FakeUpstream(default=Answer(hang="headers")), _config())
    tasks = []
    for i, group in enumerate((0, 1, 0, 1)):
        # Each sent before the next: none has its first byte, none is in the prefix index.
        tasks.append(asyncio.create_task(r.pipeline.open(chat(group, f"q{i}"), [], _now())))
        await hung(r)
    calls = r.upstream.calls
    assert calls[0] == calls[2] and calls[1] == calls[3] and calls[0] != calls[1], calls
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert r.idle() and len(r.pipeline._affinity.inflight) == 0


async def test_a_retried_request_is_followed_to_the_replica_it_moved_to() -> None:
    answers = [Answer(status=503), Answer(hang="headers"), Answer(hang="headers")]
    r = pipeline_rig(FakeUpstream(sequence=answers), _config())
    first = asyncio.create_task(r.pipeline.open(chat(0, "a"), [], _now()))
    await hung(r)
    second = asyncio.create_task(r.pipeline.open(chat(0, "b"), [], _now()))
    await hung(r)
    failed, moved_to, followed = r.upstream.calls
    assert followed == moved_to != failed
    for t in (first, second):
        t.cancel()
    await asyncio.gather(first, second, return_exceptions=True)
    assert len(r.pipeline._affinity.inflight) == 0


def _config(inflight: float | None = 0.5) -> GatewayConfig:
    """The default profile, its in-flight threshold set to `inflight` (0.5 is the default's)."""
    default = BUILTIN_PROFILES["default"]
    picker = replace(default.picker, params={**default.picker.params, "inflight": inflight})
    profile = replace(default, picker=picker, name="following")
    routing = RoutingConfig(profile="following", profiles={"following": profile})
    return GatewayConfig(routing=routing, replicas=replica_configs(4, MODEL))


def _now() -> float:
    return time.perf_counter()


async def test_a_profile_that_does_not_follow_them_keeps_no_prefixes_in_flight() -> None:
    # Nothing reads them (affinity_guard's inflight is None): not kept, not paid for.
    r = pipeline_rig(FakeUpstream(default=Answer(hang="headers")), _config(None))
    task = asyncio.create_task(r.pipeline.open(chat(0, "q"), [], _now()))
    await hung(r)
    assert sum(r.in_flight().values()) == 1 and len(r.pipeline._affinity.inflight) == 0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    default = pipeline_rig(FakeUpstream(), GatewayConfig(replicas=replica_configs(4, MODEL)))
    assert default.pipeline._router.reads_inflight and not r.pipeline._router.reads_inflight
