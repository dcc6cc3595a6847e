"""The suite's clients: closed-loop streams with a deadline each (some leave mid-stream on
purpose), and a slowloris attacker trickling request heads on many connections."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from benchmarks.faults.accounting import CANCELLED, ERROR, LOST, Record, StreamVerdict, http_outcome
from benchmarks.faults.procs import HOST

_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
          "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
          "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu")  # fmt: skip


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """What the load generator sends and how its clients behave."""

    concurrency: int = 200
    duration_s: float = 100.0
    # Every request gives up (and counts as lost: a hang) after this long.
    deadline_s: float = 60.0
    min_tokens: int = 64
    max_tokens: int = 384
    # Share of requests sent without `stream` (the answer in one piece).
    unary_share: float = 0.1
    # Share of streams whose client leaves after a random number of events.
    cancel_share: float = 0.1
    # A client pauses this long (uniform, seconds) after an error before its next request.
    error_pause_s: tuple[float, float] = (0.1, 0.4)
    prompts: int = 64
    seed: int = 0


@dataclass
class LoadRun:
    """The records of one load run, as they arrive; `sent` counts requests begun."""

    t0: float
    sent: int = 0
    records: list[Record] = field(default_factory=list)
    in_flight: int = 0


def _prompts(settings: LoadSettings) -> list[str]:
    rng = random.Random(settings.seed)
    return [
        " ".join(rng.choice(_WORDS) for _ in range(rng.randint(20, 200)))
        for _ in range(settings.prompts)
    ]


def _body(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    index: int,
    run: LoadRun,
    deadline_s: float,
    leave_after: int | None,
) -> Record:
    """Send one request and say how it ended; never raises (but for CancelledError)."""
    started = time.monotonic() - run.t0
    status, events = 0, 0

    def record(kind: str, detail: str) -> Record:
        return Record(index, kind, detail, status, started, time.monotonic() - run.t0, events)

    try:
        async with asyncio.timeout(deadline_s):
            async with session.post(url, json=body) as resp:
                status = resp.status
                if status != 200 or not body["stream"]:
                    kind, detail = http_outcome(status, await resp.read())
                    return record(kind, detail)
                verdict = StreamVerdict()
                async for line in resp.content:
                    verdict.feed(line)
                    events = verdict.events
                    if leave_after is not None and events >= leave_after:
                        resp.close()  # the client goes away: the gateway must free its slot
                        return record(CANCELLED, f"after_{events}_events")
                kind, detail = verdict.outcome()
                return record(kind, detail)
    except TimeoutError:
        return record(LOST, "hang")
    except (aiohttp.ClientError, OSError) as exc:
        return record(LOST, f"transport:{type(exc).__name__}")


async def run_load(
    settings: LoadSettings, url: str, model: str, stop_sending: Callable[[], bool] | None = None
) -> LoadRun:
    """`concurrency` closed-loop clients for `duration_s`; then waits for every request's end."""
    run = LoadRun(t0=time.monotonic())
    prompts = _prompts(settings)
    target = url + "/v1/chat/completions"
    # A fresh connection per request: a reused one the gateway closed while idle would be the
    # client's race, not the gateway's failure.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    end = run.t0 + settings.duration_s

    async def client(worker: int) -> None:
        rng = random.Random(settings.seed * 100_003 + worker)
        while time.monotonic() < end and not (stop_sending and stop_sending()):
            stream = rng.random() >= settings.unary_share
            tokens = rng.randint(settings.min_tokens, settings.max_tokens)
            body = _body(model, rng.choice(prompts), tokens, stream)
            leave = None
            if stream and rng.random() < settings.cancel_share:
                leave = rng.randint(1, max(1, tokens // 16))
            index, run.sent = run.sent, run.sent + 1
            run.in_flight += 1
            try:
                rec = await one_request(
                    session, target, body, index, run, settings.deadline_s, leave
                )
            finally:
                run.in_flight -= 1
            run.records.append(rec)
            if rec.kind == ERROR:
                await asyncio.sleep(rng.uniform(*settings.error_pause_s))  # a client backs off

    async with aiohttp.ClientSession(connector=connector) as session, asyncio.TaskGroup() as tg:
        for w in range(settings.concurrency):
            tg.create_task(client(w))
    return run


@dataclass
class SlowlorisStats:
    """What the attacker saw: connections opened, how the gateway ended each, how long it took."""

    opened: int = 0
    refused: int = 0
    answered: dict[str, int] = field(default_factory=dict)
    closed_silently: int = 0
    # Still open when the attack stopped, and the oldest of those then.
    open_at_end: int = 0
    oldest_at_end_s: float = 0.0
    # Connections the gateway ended: open for how long.
    durations: list[float] = field(default_factory=list)

    @property
    def longest_open_s(self) -> float:
        return max((*self.durations, self.oldest_at_end_s), default=0.0)

    def to_json(self) -> dict[str, Any]:
        durations = sorted(self.durations)
        median = durations[len(durations) // 2] if durations else None
        return {
            "connections_opened": self.opened,
            "refused": self.refused,
            "answered_by_status": dict(sorted(self.answered.items())),
            "closed_without_answer": self.closed_silently,
            "ended_by_gateway": len(durations),
            "median_open_s": None if median is None else round(median, 3),
            "open_at_end": self.open_at_end,
            "oldest_at_end_s": round(self.oldest_at_end_s, 3),
            "longest_open_s": round(self.longest_open_s, 3),
        }


async def _trickle(port: int, gap_s: float, stats: SlowlorisStats, stop: asyncio.Event) -> None:
    """One connection: a request line, then a header byte every `gap_s` until cut off."""
    opened = time.monotonic()
    try:
        async with asyncio.timeout(5.0):
            reader, writer = await asyncio.open_connection(HOST, port)
    except (OSError, TimeoutError):
        stats.refused += 1
        await asyncio.sleep(gap_s)  # refused at the door: try again later, not in a spin
        return
    stats.opened += 1
    first: bytes | None = None
    read = asyncio.ensure_future(reader.read(256))
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nX-Slow: ")
        while not stop.is_set():
            done, _ = await asyncio.wait({read}, timeout=gap_s)
            if done:
                first = read.result()
                break
            writer.write(b"a")
            await writer.drain()
    except (OSError, ConnectionError):
        first = b""  # cut while we wrote: closed without an answer
    finally:
        read.cancel()
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()
    lasted = time.monotonic() - opened
    if first is None:
        stats.open_at_end += 1
        stats.oldest_at_end_s = max(stats.oldest_at_end_s, lasted)
        return
    stats.durations.append(lasted)
    if first.startswith(b"HTTP/1."):
        code = first.split(b" ", 2)[1].decode(errors="replace")
        stats.answered[code] = stats.answered.get(code, 0) + 1
    else:
        stats.closed_silently += 1


async def slowloris(
    port: int, connections: int, gap_s: float, stop: asyncio.Event
) -> SlowlorisStats:
    """`connections` trickling connections, each reopened when the gateway closes it."""
    stats = SlowlorisStats()

    async def attacker() -> None:
        while not stop.is_set():
            await _trickle(port, gap_s, stats, stop)

    async with asyncio.TaskGroup() as tg:
        for _ in range(connections):
            tg.create_task(attacker())
    return stats
