"""A closed-loop gRPC load generator: grpc.aio clients in worker processes of their own.

A Python gRPC client costs about as much CPU per call as the gateway spends relaying it, so one
client process would measure itself: `GrpcLoadgen` spreads the in-flight calls (and channels,
each its own HTTP/2 connection) over several worker processes (`python -m
benchmarks.loadgen_grpc`), driven over stdin/stdout with one JSON line per message:

- `{"op": "open", ...}`: open this worker's channels and wait until each is connected, answer
  `{"ready": true}`; connecting stays outside the measured window.
- `{"op": "go", "start": t0, "end": t1}`: keep `concurrency` calls in flight from t0 to t1 (on
  CLOCK_MONOTONIC, the same in every process), drain, close the channels, answer the figures.

Calls go to `Chat` and `StreamChat` of llmgateway.v1.Inference with a request equal to the HTTP
load generator's. Stream messages stay undecoded except the first (must carry the role) and the
last (must carry finish_reason "stop"), which keeps the client's share of the CPU low.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import orjson
import uvloop

from benchmarks.loadgen_http import RoundResult
from benchmarks.overhead_procs import child_env, cpu_seconds
from gateway.grpc.gen import gateway_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["Inference"]
CHAT = f"/{_SERVICE.full_name}/Chat"
STREAM_CHAT = f"/{_SERVICE.full_name}/StreamChat"
# Without a local subchannel pool, channels with equal arguments share one TCP connection.
_CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0))
_REPO = Path(__file__).resolve().parents[1]


class GrpcLoadgenError(Exception):
    """A gRPC load generator worker failed to start, connect or answer."""


def chat_request(model: str) -> bytes:
    """The serialized ChatRequest equal to the HTTP load generator's body (stream is the RPC)."""
    data: bytes = pb.ChatRequest(
        model=model,
        messages=[pb.ChatMessage(role="user", content="Say hello in five words.")],
        max_tokens=16,
    ).SerializeToString()
    return data


def _stream_ok(first: bytes, last: bytes) -> bool:
    head = pb.ChatChunk.FromString(first)
    tail = pb.ChatChunk.FromString(last)
    return (
        bool(head.choices)
        and head.choices[0].delta.role == "assistant"
        and bool(tail.choices)
        and tail.choices[0].finish_reason == "stop"
    )


def _unary_ok(resp: pb.ChatResponse) -> bool:
    return bool(resp.choices) and resp.choices[0].finish_reason == "stop"


class _WorkerRound:
    """One worker's share of a round: its channels, in-flight calls and what they measured."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.concurrency = int(spec["concurrency"])
        self.stream = bool(spec["stream"])
        self.expect = int(spec["expect"])
        self.timeout_s = float(spec["timeout_s"])
        self.request = bytes.fromhex(spec["request"])
        self.channels = [
            grpc.aio.insecure_channel(spec["target"], options=_CHANNEL_OPTIONS)
            for _ in range(int(spec["channels"]))
        ]
        self.latencies: list[float] = []
        self.ttfc: list[float] = []
        self.messages = 0
        self.errors: dict[str, int] = {}

    async def connect(self) -> None:
        async with asyncio.timeout(self.timeout_s):
            await asyncio.gather(*(ch.channel_ready() for ch in self.channels))

    async def close(self) -> None:
        async with asyncio.timeout(self.timeout_s):
            await asyncio.gather(*(ch.close() for ch in self.channels))

    def _error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    async def _slot(self, channel: grpc.aio.Channel, end: float) -> None:
        # Raw bytes both ways: the request is serialized once, stream messages are not decoded.
        stream_call = channel.unary_stream(STREAM_CHAT)
        unary_call = channel.unary_unary(CHAT, response_deserializer=pb.ChatResponse.FromString)
        while time.monotonic() < end:
            sent = time.monotonic()
            first_at, n, kind = 0.0, 0, ""
            try:
                if self.stream:
                    head = tail = b""
                    async for msg in stream_call(self.request, timeout=self.timeout_s):
                        if n == 0:
                            first_at, head = time.monotonic(), msg
                        n += 1
                        tail = msg
                    if n != self.expect or not _stream_ok(head, tail):
                        kind = "bad_stream"
                elif not _unary_ok(await unary_call(self.request, timeout=self.timeout_s)):
                    kind = "bad_response"
            except grpc.aio.AioRpcError as exc:
                kind = f"grpc_{exc.code().name.lower()}"
            done = time.monotonic()
            if kind:
                self._error(kind)
            elif done < end:
                self.latencies.append(done - sent)
                if self.stream:
                    self.ttfc.append(first_at - sent)
                    self.messages += n

    async def run(self, start: float, end: float) -> dict[str, Any]:
        await asyncio.sleep(max(0.0, start - time.monotonic()))  # a shared start instant
        channels = self.channels
        slots = [self._slot(channels[i % len(channels)], end) for i in range(self.concurrency)]
        try:
            async with asyncio.timeout(max(0.0, end - time.monotonic()) + self.timeout_s):
                await asyncio.gather(*slots)
        except TimeoutError:
            self._error("drain_timeout")
        return {
            "requests": len(self.latencies),
            "latencies": self.latencies,
            "ttfc": self.ttfc,
            "messages": self.messages,
            "errors": self.errors,
        }


def _reply(obj: Mapping[str, Any]) -> None:
    sys.stdout.buffer.write(orjson.dumps(obj) + b"\n")
    sys.stdout.buffer.flush()


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    current: _WorkerRound | None = None
    while line := await reader.readline():  # EOF: the benchmark is done with this worker
        cmd = orjson.loads(line)
        try:
            if cmd["op"] == "open":
                current = _WorkerRound(cmd)
                await current.connect()
                _reply({"ready": True})
            elif cmd["op"] == "go" and current is not None:
                result = await current.run(float(cmd["start"]), float(cmd["end"]))
                await current.close()
                current = None
                _reply(result)
            else:
                _reply({"error": f"unexpected command {cmd.get('op')!r}"})
        except (TimeoutError, grpc.aio.AioRpcError, OSError) as exc:
            _reply({"error": repr(exc)})


def main() -> None:
    """Worker entry point: serve the benchmark's commands until stdin closes."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve())


def _shares(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class GrpcLoadgen:
    """The benchmark's side of the worker processes: runs rounds and adds up their figures."""

    def __init__(self, procs: list[asyncio.subprocess.Process], log: Path) -> None:
        self._procs = procs
        self._log = log

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids."""
        return [p.pid for p in self._procs]

    def cpu_seconds(self) -> float:
        """CPU seconds so far of every worker together."""
        return sum(cpu_seconds(pid) for pid in self.pids)

    async def _ask(self, proc: asyncio.subprocess.Process, cmd: Any, wait_s: float) -> Any:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(orjson.dumps(cmd) + b"\n")
        try:
            async with asyncio.timeout(wait_s):
                await proc.stdin.drain()
                line = await proc.stdout.readline()
        except TimeoutError:
            raise GrpcLoadgenError(f"gRPC worker {proc.pid} did not answer in {wait_s} s") from None
        if not line:
            tail = self._log.read_text(errors="replace")[-2000:]
            raise GrpcLoadgenError(f"gRPC worker {proc.pid} exited: {tail}")
        reply = orjson.loads(line)
        if "error" in reply:
            raise GrpcLoadgenError(f"gRPC worker {proc.pid}: {reply['error']}")
        return reply

    async def run_round(
        self,
        target: str,
        request: bytes,
        *,
        concurrency: int,
        channels: int,
        duration_s: float,
        stream: bool,
        expect_messages: int,
        cpu_snapshot: Callable[[], Mapping[str, float]],
        timeout_s: float = 10.0,
    ) -> RoundResult:
        """Keep `concurrency` calls in flight for `duration_s`; `loadgen` CPU is the workers'."""
        conc = _shares(concurrency, len(self._procs))
        chans = _shares(max(channels, len(self._procs)), len(self._procs))
        busy = [(p, c, min(k, c)) for p, c, k in zip(self._procs, conc, chans, strict=True) if c]
        base = {"op": "open", "target": target, "stream": stream, "expect": expect_messages}
        base |= {"timeout_s": timeout_s, "request": request.hex()}
        await asyncio.gather(
            *(
                self._ask(p, base | {"concurrency": c, "channels": k}, timeout_s + 5.0)
                for p, c, k in busy
            )
        )

        def snapshot() -> dict[str, float]:
            return {**cpu_snapshot(), "loadgen": self.cpu_seconds()}

        start = time.monotonic() + 0.05  # time for every worker to read "go" before it starts
        end = start + duration_s
        go = {"op": "go", "start": start, "end": end}
        asks = asyncio.gather(*(self._ask(p, go, duration_s + 2 * timeout_s) for p, _, _ in busy))
        try:
            await asyncio.sleep(max(0.0, start - time.monotonic()))
            cpu0, t0 = snapshot(), time.monotonic()
            await asyncio.sleep(max(0.0, end - time.monotonic()))
            cpu1, elapsed = snapshot(), time.monotonic() - t0
        except BaseException:
            asks.cancel()
            raise
        replies = await asks
        kinds: dict[str, int] = {}
        for r in replies:
            for kind, n in r["errors"].items():
                kinds[kind] = kinds.get(kind, 0) + n
        return RoundResult(
            duration_s=elapsed,
            requests=sum(r["requests"] for r in replies),
            errors=sum(kinds.values()),
            latencies_s=[x for r in replies for x in r["latencies"]],
            ttfc_s=[x for r in replies for x in r["ttfc"]],
            events=sum(r["messages"] for r in replies),
            http_chunks=0,
            cpu_s={k: cpu1[k] - cpu0[k] for k in cpu0},
            error_kinds=kinds,
        )


@contextlib.asynccontextmanager
async def grpc_loadgen(processes: int) -> AsyncIterator[GrpcLoadgen]:
    """Start `processes` idle workers; close their stdin and wait for them on exit."""
    procs: list[asyncio.subprocess.Process] = []
    with tempfile.TemporaryDirectory(prefix="llm-gw-grpc-loadgen-") as tmp:
        log = Path(tmp) / "workers.log"
        try:
            with log.open("wb") as err:
                for _ in range(processes):
                    procs.append(
                        await asyncio.create_subprocess_exec(
                            sys.executable,
                            "-m",
                            "benchmarks.loadgen_grpc",
                            stdin=asyncio.subprocess.PIPE,
                            stdout=asyncio.subprocess.PIPE,
                            stderr=err,
                            # One reply line carries every latency of a round: past 64 KiB.
                            limit=2**24,
                            env=child_env(),
                            cwd=_REPO,
                        )
                    )
            yield GrpcLoadgen(procs, log)
        finally:
            for proc in procs:
                await _stop(proc)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        async with asyncio.timeout(5.0):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()


if __name__ == "__main__":
    main()
