"""CPU of one in-flight beat round trip: the client (redis-py, this process) and Redis (Lua).

python beat_cost.py PORT CHECKOUT: a redis-server on 127.0.0.1:PORT, the gateway at CHECKOUT.
"""

from __future__ import annotations

import asyncio
import sys
import time

from redis.asyncio import BlockingConnectionPool, Redis

sys.path.insert(0, sys.argv[2])
from gateway.shared_state import writes
from gateway.shared_state.scripts import ALL, Keys

N = 2000


async def main(port: int) -> None:
    url = f"redis://127.0.0.1:{port}/0"
    pool = BlockingConnectionPool.from_url(
        url, max_connections=8, timeout=0.25, socket_timeout=0.25
    )
    r = Redis(connection_pool=pool)
    for text in ALL.values():
        await r.script_load(text)
    keys = Keys("bb")
    # One peer with counts on 8 replicas.
    await r.zadd(keys.procs, {"peer": int(time.time() * 1000) + 100_000})
    await r.hset(keys.inflight("peer"), mapping={f"replica-{i}": 3 for i in range(8)})
    await r.config_resetstat()
    counts = [(f"replica-{i}", 4) for i in range(8)]
    new = "version" in writes.queue_beat.__code__.co_varnames
    t0 = time.process_time()
    for _ in range(N):
        pipe = r.pipeline(transaction=False)
        if new:
            writes.queue_beat(pipe, keys, "me", 3000, 1, dict(counts), {})  # type: ignore[call-arg]
        else:
            writes.queue_beat(pipe, keys, "me", 3000, counts, {})  # type: ignore[call-arg,arg-type]
        await pipe.execute()
    cpu = time.process_time() - t0
    ev = (await r.info("commandstats"))["cmdstat_evalsha"]
    print(
        f"{sys.argv[2]}: client CPU {cpu / N * 1e6:.0f} us/beat,"
        f" Redis {ev['usec_per_call']:.1f} us/beat (EVALSHA, nested commands included)"
    )
    await r.aclose()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
