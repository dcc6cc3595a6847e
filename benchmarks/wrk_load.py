"""wrk (one thread, C, epoll) as the overhead benchmark's load generator: script, run, parse.

A Lua script posts the chat (or completions) body on every request and, in wrk's `done` hook,
prints one `WRKJSON {...}` line with the counts and the latency percentiles in microseconds,
which is all that is read of wrk's output.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import orjson

from benchmarks.system_deps import which

_MARK = "WRKJSON "
# wrk's own timeout per request; a slow answer past it counts as an error, not a latency.
_REQUEST_TIMEOUT_S = 10


class WrkError(Exception):
    """wrk failed to run or printed no result."""


def request_body(model: str, stream: bool, kind: str = "chat") -> bytes:
    """The small request every benchmark request sends (the Python generator's own body)."""
    if kind == "chat":
        doc: dict[str, object] = {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello in five words."}],
        }
    else:
        doc = {"model": model, "prompt": "Say hello in five words."}
    return orjson.dumps({**doc, "max_tokens": 16, "stream": stream})


def _lua_string(data: bytes) -> str:
    # Every byte as a decimal escape: no quoting question for any body or header value.
    return '"' + "".join(f"\\{b}" for b in data) + '"'


def lua_script(body: bytes, headers: dict[str, str]) -> str:
    """The wrk script: POST `body` with `headers`; `done` prints the WRKJSON line."""
    hdrs = "".join(
        f"wrk.headers[{_lua_string(k.encode())}] = {_lua_string(v.encode())}\n"
        for k, v in {"content-type": "application/json", **headers}.items()
    )
    return f"""wrk.method = "POST"
wrk.body = {_lua_string(body)}
{hdrs}
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{_MARK}{{"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,' ..
    '"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"mean_us":%f}}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean))
end
"""


@dataclass(frozen=True, slots=True)
class WrkResult:
    """One wrk run's figures (latencies from send to the whole answer, in seconds)."""

    requests: int
    duration_s: float
    errors: int  # connect, read, write, timeouts and non-2xx/3xx answers
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float
    mean_s: float
    bytes: int

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0


def parse_output(stdout: str) -> WrkResult:
    """The WRKJSON line of a run (WrkError when it is missing or not JSON)."""
    for line in stdout.splitlines():
        if line.startswith(_MARK):
            try:
                d = orjson.loads(line[len(_MARK) :])
            except orjson.JSONDecodeError as exc:
                raise WrkError(f"bad wrk result line {line!r}: {exc}") from None
            errors = sum(d[k] for k in ("connect", "read", "write", "status", "timeout"))
            return WrkResult(
                requests=d["requests"],
                duration_s=d["duration_us"] / 1e6,
                errors=errors,
                p50_s=d["p50_us"] / 1e6,
                p90_s=d["p90_us"] / 1e6,
                p99_s=d["p99_us"] / 1e6,
                max_s=d["max_us"] / 1e6,
                mean_s=d["mean_us"] / 1e6,
                bytes=d["bytes"],
            )
    raise WrkError(f"no {_MARK.strip()} line in wrk's output: {stdout[-500:]!r}")


def wrk_binary() -> str | None:
    """The wrk executable, or None when it is not installed."""
    return which("wrk")


def wrk_argv(exe: str, url: str, script: Path, connections: int, duration_s: float) -> list[str]:
    """One thread, `connections` keep-alive connections, one request in flight each."""
    return [
        exe,
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(duration_s))}s",
        f"--timeout={_REQUEST_TIMEOUT_S}s",
        "-s",
        str(script),
        url,
    ]


async def run_wrk(url: str, script: Path, connections: int, duration_s: float) -> WrkResult:
    """Run wrk once against `url` and return its figures."""
    exe = wrk_binary()
    if exe is None:
        raise WrkError("wrk is not installed (benchmarks/system_deps.py installs it)")
    proc = await asyncio.create_subprocess_exec(
        *wrk_argv(exe, url, script, connections, duration_s),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(duration_s + _REQUEST_TIMEOUT_S + 10):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise WrkError(f"wrk did not finish against {url}") from None
    if proc.returncode != 0:
        raise WrkError(f"wrk exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
    return parse_output(out.decode(errors="replace"))
