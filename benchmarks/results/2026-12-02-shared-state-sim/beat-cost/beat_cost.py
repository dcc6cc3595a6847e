"""Client CPU per in-flight beat of the shared-state scripts in the source tree argv[1]."""

from __future__ import annotations

import asyncio
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, sys.argv[1])

import redis.asyncio as aioredis

import gateway.shared_state.scripts as sc
from tests.redis_server import RedisServer

COUNTS = [(f"sim-{i}", 1) for i in range(8)]


async def beat(r: aioredis.Redis, keys: sc.Keys) -> None:
    pairs = [x for p in COUNTS for x in p]
    if "beat" in sc.SHAS:  # one script, one EVALSHA
        await r.evalsha(  # type: ignore[misc]
            sc.SHAS["beat"], 2, keys.procs, keys.inflight("p1"), "p1", 3000,
            keys.inflight_base, len(COUNTS), *pairs,
        )  # fmt: skip
        return
    pipe = r.pipeline(transaction=False)  # the two scripts of before, one pipeline
    pipe.evalsha(sc.SHAS["heartbeat"], 2, keys.procs, keys.inflight("p1"), "p1", 3000,
                 len(COUNTS), *pairs)  # fmt: skip
    pipe.evalsha(sc.SHAS["others"], 1, keys.procs, keys.inflight_base, "p1", 3000)
    await pipe.execute()


async def main() -> None:
    server = RedisServer(pathlib.Path(tempfile.mkdtemp()))
    server.start()
    try:
        r = aioredis.Redis.from_url(server.url)
        keys = sc.Keys("t")
        for text in sc.ALL.values():
            await r.script_load(text)
        for _ in range(200):
            await beat(r, keys)
        reps = []
        for _ in range(5):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(2000):
                await beat(r, keys)
            reps.append(((time.process_time() - cpu) / 2e-3, (time.perf_counter() - wall) / 2e-3))
        print(sys.argv[1], "client CPU us/beat:", [round(c) for c, _ in reps],
              "wall:", [round(w) for _, w in reps])  # fmt: skip
        await r.aclose()
    finally:
        server.stop()


asyncio.run(main())
