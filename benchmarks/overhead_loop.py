"""The hot path's loop-blocking check: no event-loop callback takes over 1 ms of CPU.

`python -m benchmarks.overhead_loop [--concurrency 1,16] [--requests N] [--out FILE]` starts
the static upstream and a gateway whose every loop callback is timed, drives non-streamed and
streamed chat completions at each concurrency (`--long-every N`: one in N with an 8k-token
prompt), and reports per-callback CPU (max, p99, count over the limit). Exit status 1 when any
callback after the warm-up took over `--limit-ms`.

Why per callback, and CPU: a callback is one request's synchronous step (one task step, one
socket's read: at c=64 a loop iteration runs many, each still one request's), so bounding each
bounds what any one request holds the loop for; thread CPU time, not wall time, so that the
other processes on a shared machine preempting the gateway do not read as its blocking.
uvloop's callbacks run in C and cannot be timed one by one, so the timed gateway runs on
asyncio's own loop, which does more per callback: a bound it meets, uvloop meets too.

`python -m benchmarks.overhead_loop --serve [--inject-ms MS] -- GATEWAY-ARGS` is the timed
gateway itself (`gateway.cli` with GATEWAY-ARGS): it prints `SLOW <monotonic> <cpu ms> <callback>`
to stderr for each callback over the limit, forgets what came before on SIGUSR1 (the end of
the warm-up) and prints `STATS <json>` on SIGUSR2; `GC <monotonic> gen<N> <ms>` for each
garbage collection over the limit (listed among the slow lines, reported apart: the gc
policy's pauses, gateway/http/gc_policy.py, not a request's work). `--inject-ms` adds that much CPU
to every request's feature lookup: the check's own test that it catches a blocking step.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.overhead_procs import _Child, _spawn, free_ports, wait_ready
from benchmarks.static_upstream import MODEL

HOST = "127.0.0.1"
LIMIT_MS = 1.0
# With --long-every N, one request in N carries a prompt of ~LONG_PROMPT_TOKENS (issue 17's 8k).
LONG_PROMPT_TOKENS = 8192
_START_TIMEOUT_S = 30.0


# --- the timed gateway (its own process) --------------------------------------------------


class _Timings:
    """Per-callback thread CPU of the loop (less garbage collection), since the last mark."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.samples: list[float] = []
        # Every collection's thread CPU: cumulative (taken out of the callback it ran in), and
        # each one since the mark (the collector's pauses are reported apart).
        self.gc_total_s = 0.0
        self.collections: list[float] = []

    def mark(self) -> None:
        self.samples.clear()
        self.collections.clear()

    def stats(self) -> dict[str, Any]:
        s = sorted(self.samples)
        over = [x for x in s if x > self.limit_s]
        return {
            "callbacks": len(s),
            "max_ms": round(s[-1] * 1e3, 3) if s else 0.0,
            "p99_ms": round(s[int(0.99 * (len(s) - 1))] * 1e3, 3) if s else 0.0,
            "over_limit": len(over),
            "gc_max_ms": round(max(self.collections, default=0.0) * 1e3, 3),
            "gc_over_limit": sum(1 for c in self.collections if c > self.limit_s),
        }


def _time_callbacks(timings: _Timings) -> None:
    """Wrap asyncio's Handle._run: every callback's thread CPU, the slow ones printed."""
    handle_run: Callable[[asyncio.Handle], None] = getattr(asyncio.Handle, "_run")  # noqa: B009
    clock, limit, out = time.thread_time, timings.limit_s, timings.samples

    def timed(handle: asyncio.Handle) -> None:
        g0 = timings.gc_total_s
        t0 = clock()
        handle_run(handle)
        # A collection is the collector's pause, not the callback's own work: counted apart.
        dt = clock() - t0 - (timings.gc_total_s - g0)
        out.append(dt)
        if dt > limit:
            where = _describe(handle)
            print(f"SLOW {time.monotonic():.6f} {dt * 1e3:.3f} {where}", file=sys.stderr)

    setattr(asyncio.Handle, "_run", timed)  # noqa: B010 (a private method, on purpose)


def _time_collections(timings: _Timings) -> None:
    """Each garbage collection's thread CPU; `GC <monotonic> gen<N> <ms>` for one over the limit."""
    started: list[float] = [0.0]

    def hook(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
            return
        took = time.thread_time() - started[0]
        timings.gc_total_s += took
        timings.collections.append(took)
        if took > timings.limit_s:
            gen = info["generation"]
            print(f"GC {time.monotonic():.6f} gen{gen} {took * 1e3:.3f}", file=sys.stderr)

    gc.callbacks.append(hook)


def _describe(handle: asyncio.Handle) -> str:
    """A task step as its coroutine (a request is uvicorn's run_asgi), else the handle."""
    owner = getattr(getattr(handle, "_callback", None), "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        return f"task {getattr(coro, '__qualname__', coro)!s}"
    protocol = getattr(owner, "_protocol", None)  # a socket's read: whose connection
    if protocol is not None:
        return f"{handle!r} of {type(protocol).__qualname__}"
    return repr(handle)


def _inject(ms: float) -> None:
    """Every request's feature lookup burns `ms` of CPU: a blocking step the check must see."""
    from gateway.proxy.affinity import Affinity

    lookup = Affinity.lookup

    def slow_lookup(self: Affinity, *args: Any, **kwargs: Any) -> Any:
        end = time.thread_time() + ms / 1e3
        while time.thread_time() < end:
            pass
        return lookup(self, *args, **kwargs)

    setattr(Affinity, "lookup", slow_lookup)  # noqa: B010


def serve(argv: list[str], limit_ms: float, inject_ms: float) -> int:
    """Run `gateway.cli argv` on asyncio's loop with every callback timed."""
    import gateway.cli

    timings = _Timings(limit_ms / 1e3)
    _time_callbacks(timings)
    _time_collections(timings)
    if inject_ms > 0:
        _inject(inject_ms)
    # asyncio's own loop: uvloop's callbacks cannot be timed one by one.
    setattr(gateway.cli, "_install_uvloop", lambda: None)  # noqa: B010

    def mark(_sig: int, _frame: object) -> None:
        timings.mark()

    def report(_sig: int, _frame: object) -> None:
        print(f"STATS {json.dumps(timings.stats())}", file=sys.stderr, flush=True)

    signal.signal(signal.SIGUSR1, mark)
    signal.signal(signal.SIGUSR2, report)
    return gateway.cli.main(argv)


# --- the check ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoopCheck:
    """One concurrency's figures: per-callback CPU after the warm-up, and the slow ones."""

    concurrency: int
    requests: int
    callbacks: int
    max_ms: float
    p99_ms: float
    over_limit: int
    # Garbage collections since the warm-up: the longest, and how many took over the limit
    # (their CPU is not counted in the callback they interrupted).
    gc_max_ms: float
    gc_over_limit: int
    slow: tuple[str, ...]


def _toml(port: int, upstream: str) -> str:
    return (
        f'[server]\nhost = "{HOST}"\nport = {port}\ndrain_timeout_s = 1.0\n\n'
        f'[[replicas]]\nurl = "{upstream}"\nname = "static"\n'
    )


@contextlib.asynccontextmanager
async def _timed_gateway(work: Path, limit_ms: float, inject_ms: float) -> AsyncIterator[Any]:
    children: list[_Child] = []
    try:
        log = work / "upstream.log"
        with log.open("wb") as f:
            args = ["benchmarks.static_upstream", "--host", HOST, "--port", "0", "--chunks", "16"]
            up = await _spawn(args, f, asyncio.subprocess.PIPE)
        children.append(_Child("static upstream", up, log))
        assert up.stdout is not None
        async with asyncio.timeout(_START_TIMEOUT_S):
            line = (await up.stdout.readline()).decode()
        up_port = int(line.rsplit(":", 1)[1])
        await wait_ready("static upstream", up, log, HOST, up_port, "/health")
        (port,) = free_ports(HOST, 1)
        cfg = work / "gateway.toml"
        cfg.write_text(_toml(port, f"http://{HOST}:{up_port}"))
        log = work / "gateway.log"
        args = ["benchmarks.overhead_loop", "--serve", "--limit-ms", str(limit_ms)]
        args += ["--inject-ms", str(inject_ms), "--", "--log-level", "warning"]
        args += ["serve", "-c", str(cfg)]
        with log.open("wb") as f:
            gw = await _spawn(args, f, asyncio.subprocess.DEVNULL)
        children.append(_Child("timed gateway", gw, log))
        await wait_ready("timed gateway", gw, log, HOST, port, "/ready")
        yield gw, port, log
        for child in children:
            child.check_alive()
    finally:
        for child in reversed(children):
            await child.stop()


def long_prompt(i: int, tokens: int = LONG_PROMPT_TOKENS) -> str:
    """A prompt of about `tokens` tokens (one per word), distinct per `i` from its first word."""
    return f"request {i}: " + " ".join(f"w{k % 97}" for k in range(tokens))


async def _load(port: int, concurrency: int, requests: int, long_every: int = 0) -> None:
    url = f"http://{HOST}:{port}/v1/chat/completions"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}]}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:

        async def one(i: int) -> None:
            stream = i % 4 == 3  # a quarter streamed
            doc: dict[str, Any] = {**body, "stream": stream}
            if long_every and i % (2 * long_every) in (1, long_every + 3):  # streamed and not
                # Parsing, templating, tokenizing and hashing grow with the prompt.
                doc["messages"] = [{"role": "user", "content": long_prompt(i)}]
            r = await client.post(url, json=doc)
            r.raise_for_status()

        async def worker(k: int) -> None:
            for i in range(k, requests, concurrency):
                await one(i)

        await asyncio.gather(*(worker(k) for k in range(concurrency)))


def _size(log: Path) -> int:
    return log.stat().st_size


def _lines(log: Path, since: int) -> list[str]:
    """The timed gateway's stderr from byte `since` on (a small local file)."""
    return log.read_bytes()[since:].decode(errors="replace").splitlines()


async def _stats(gw: asyncio.subprocess.Process, log: Path, since: int) -> dict[str, Any]:
    gw.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        for line in _lines(log, since):
            if line.startswith("STATS "):
                stats: dict[str, Any] = json.loads(line[6:])
                return stats
        await asyncio.sleep(0.05)  # polled with a deadline: the child prints when signalled
    raise RuntimeError(f"the timed gateway printed no STATS: {_lines(log, 0)[-20:]}")


async def check(
    concurrency: tuple[int, ...],
    requests: int,
    limit_ms: float = LIMIT_MS,
    inject_ms: float = 0.0,
    long_every: int = 0,
) -> list[LoopCheck]:
    """Each concurrency: warm up, mark, `requests` requests, the callbacks' CPU since the mark."""
    out: list[LoopCheck] = []
    with tempfile.TemporaryDirectory(prefix="llm-gw-loop-") as tmp:
        async with _timed_gateway(Path(tmp), limit_ms, inject_ms) as (gw, port, log):
            for conc in concurrency:
                await _load(port, conc, 4 * conc)  # connections open, code paths warm
                since = _size(log)
                gw.send_signal(signal.SIGUSR1)
                await asyncio.sleep(0.2)  # the mark lands before the load (a signal is async)
                await _load(port, conc, requests, long_every)
                stats = await _stats(gw, log, since)
                slow = tuple(x for x in _lines(log, since) if x.startswith(("SLOW ", "GC ")))
                out.append(LoopCheck(conc, requests, slow=slow[:200], **stats))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="be the timed gateway")
    parser.add_argument("--limit-ms", type=float, default=LIMIT_MS)
    parser.add_argument("--inject-ms", type=float, default=0.0)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--long-every", type=int, default=0, help="1 in N with an 8k prompt")
    parser.add_argument("--out", default="", help="results JSON file")
    parser.add_argument("gateway_args", nargs="*", help="after --: gateway.cli's arguments")
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.gateway_args, args.limit_ms, args.inject_ms)
    conc = tuple(int(c) for c in args.concurrency.split(","))
    rows = asyncio.run(check(conc, args.requests, args.limit_ms, args.inject_ms, args.long_every))
    for r in rows:
        print(
            f"c={r.concurrency}: {r.requests} requests, {r.callbacks} callbacks, max"
            f" {r.max_ms} ms, p99 {r.p99_ms} ms, {r.over_limit} over {args.limit_ms} ms;"
            f" garbage collections: longest {r.gc_max_ms} ms, {r.gc_over_limit} over"
        )
        for line in r.slow:
            print("  " + line)
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 1 if any(r.over_limit for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
