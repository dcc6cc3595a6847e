"""The replay's client: streams each request where its contender takes it; warm-up and probes."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson

from benchmarks.replay.contenders import Direct, Placed
from benchmarks.replay.loop import Record
from benchmarks.replay.workloads import Item
from benchmarks.routing_bench.contenders import Contender
from benchmarks.routing_bench.fleet import RunningFleet
from benchmarks.routing_bench.loadgen import stream_chat
from benchmarks.routing_bench.runner import RunError
from benchmarks.routing_bench.stats import ok
from benchmarks.routing_bench.workloads import BenchRequest

READY_TIMEOUT_S = 60.0
_POLL_S = 0.25


class Client:
    """One record per request, failures included; headers as `bench routing` sends them."""

    def __init__(
        self, session: aiohttp.ClientSession, model: str, contender: Contender, base: str
    ) -> None:
        self.session = session
        self.model = model
        self.contender = contender
        self.base = base
        self.headers = dict(getattr(contender, "headers", None) or {})

    async def send(self, item: Item) -> Record:
        req = item.req
        rid = f"{self.contender.name.replace(':', '_')}-{req.rid}"
        c = self.contender
        where: int | None = None
        base = self.base
        if isinstance(c, Direct | Placed):
            where, base = c.replica_for(item), c.url_for(item)
        rec: Record = {"rid": req.rid, "conv": item.conv, "turn": item.turn, "sent": time.time()}
        # Where it ran, when the client knows (a gateway's is filled in from its log later).
        rec["replica"] = where
        rec.update(ttft=None, gaps=[], e2e=None, tokens=0, status=0, error=None)
        rec.update(prompt_tokens=None, cached_tokens=None)
        headers = {**self.headers, "x-request-id": rid}
        if req.session is not None:
            headers["x-session-id"] = req.session
        body = orjson.dumps(req.body(self.model))
        try:
            await stream_chat(self.session, f"{base}/v1/chat/completions", body, headers, rec)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
        rec["ended"] = time.time()
        return rec


def short_request(kind: str, i: int) -> Item:
    """A few-token prompt of its own (the number first: no two share a prefix block)."""
    text = f"{i} {kind} request, not part of any workload"
    return Item(
        BenchRequest(f"{kind}-{i}", (("user", text),), 4, f"{kind}-{i}"), f"{kind}-{i}", 0, i
    )


async def warm(session: aiohttp.ClientSession, fleet: RunningFleet) -> None:
    """One short answer from every replica: start-up costs stay out of the first replay."""
    direct = Direct()
    await direct.start(fleet.info)
    client = Client(session, fleet.info.model, direct, "")
    for i in range(len(fleet.info.urls)):
        rec = await client.send(short_request("warm", i))
        if not ok(rec):
            raise RunError(f"replica {i} failed its warm-up request: {rec['error']}")


async def until_routing(client: Client) -> tuple[int, float]:
    """Probe through a started router until it answers one: (probes sent, seconds taken).

    A router's own readiness can come before it has found its workers healthy: SGLang's
    answered 503 "no available workers" for its first seconds on real vLLM. One answer is
    enough: more probes would feed a cache-aware router's tree with text of no workload.
    No answer within READY_TIMEOUT_S raises RunError.
    """
    if isinstance(client.contender, Direct | Placed):
        return 0, 0.0
    t0 = time.monotonic()
    sent = 0
    while True:
        rec = await client.send(short_request("probe", sent))
        sent += 1
        if ok(rec):
            return sent, round(time.monotonic() - t0, 2)
        if time.monotonic() - t0 > READY_TIMEOUT_S:
            raise RunError(
                f"{client.contender.name} answered no probe in {READY_TIMEOUT_S:g} s: "
                f"{rec['error']}"
            )
        await asyncio.sleep(_POLL_S)  # polling the router's readiness under a deadline
