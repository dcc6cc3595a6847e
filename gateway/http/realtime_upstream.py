"""/v1/realtime's replica side: pick a replica of the model, open its socket, relay frames."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import aiohttp
import orjson
from starlette.types import Message, Receive, Send

from gateway.errors import GatewayError, NoHealthyReplica, UpstreamFailed
from gateway.http.realtime_stages import Tally
from gateway.replicas.pool import Lease
from gateway.runtime import Runtime
from routing.types import Branch, Decision, NoReplicaError, RequestFeatures
from telemetry.tracing import RequestTrace, end_attempt

log = logging.getLogger("llm_gateway.realtime")

PATH = "/v1/realtime"
# RFC 6455's codes: the replica went away without a close handshake, or refused the socket.
BAD_GATEWAY = 1014
TOO_BIG = 1009
GOING_AWAY = 1001
# uvicorn's (and vLLM's) code for its sockets when the server stops: "service restart".
SERVICE_RESTART = 1012
# Only a frame holding this can be the event with the usage: the rest are never parsed.
_DONE = '"transcription.done"'
# A close reason is at most 123 bytes (RFC 6455 5.5.1: control frames carry 125).
_REASON_BYTES = 123


class RealtimeUnsupported(GatewayError):
    """The replica serves the model but answered the upgrade with an HTTP status."""

    status = 502


@dataclass(slots=True)
class Upstream:
    """One replica's open realtime socket and the lease that counts it in flight there."""

    ws: aiohttp.ClientWebSocketResponse
    lease: Lease


def reason(text: str) -> str:
    """`text` cut to what a close frame can carry."""
    raw = text.encode()
    if len(raw) <= _REASON_BYTES:
        return text
    return raw[: _REASON_BYTES - 3].decode(errors="ignore") + "..."


def to_upstream(code: int | None) -> int:
    """The code the replica is closed with when the client closed with `code`."""
    # The client's own choice passes; anything our server says for it (1005, 1006, 1012 on
    # shutdown, 1009 on an oversized frame) is the client going away, to the replica.
    if code == 1000 or (code is not None and 3000 <= code <= 4999):
        return code
    return GOING_AWAY


def to_client(code: int | None) -> int:
    """The code the client is closed with when the replica closed with `code`."""
    if code is None or code == 1006 or code == 1015:
        return BAD_GATEWAY  # no close frame: the replica (or the path to it) died
    if code == 1005:
        return 1000  # a close frame without a code
    if 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999:
        return code
    return BAD_GATEWAY


async def open_upstream(
    runtime: Runtime, features: RequestFeatures, query: str, trace: RequestTrace | None
) -> tuple[Upstream, Decision]:
    """A replica's socket for `features.model`, routed as `Pipeline.open` (admission, retries)."""
    pipeline = runtime.pipeline
    model = features.model
    cfg = runtime.config.upstream
    server = runtime.config.server
    pool, metrics = runtime.pool, runtime.metrics
    headers = {"x-request-id": features.request_id}
    if cfg.api_key:
        headers["authorization"] = f"Bearer {cfg.api_key}"
    tried: list[str] = []
    last: GatewayError | None = None
    unsent = False
    for attempt in range(1 + cfg.max_retries):
        # The retry budget, as for HTTP (a refused connection put no load on a replica: exempt).
        if attempt and not unsent and not pipeline.retry_allowed():
            assert last is not None
            metrics.retry_refused()
            raise last
        try:
            # No prompt, so no cache features: the profile places the session by load.
            if attempt == 0:
                decision, waited = await pipeline.admit(features)
            else:
                decision, waited = runtime.router.route(features, pool.snapshots(), tried), False
        except NoReplicaError as exc:
            if last is not None:
                raise last from None
            log.info("no replica for realtime %s: %s", model, exc.reason)
            raise NoHealthyReplica(f"No healthy replica is serving model `{model}`.") from None
        decision = pipeline.traffic.relabel(features, decision)
        if waited:
            decision = replace(decision, branch=Branch.QUEUED)
        name = decision.replica.name
        metrics.decision(name, decision.branch)
        lease = pool.acquire(name)
        url = decision.replica.url + PATH + (f"?{query}" if query else "")
        span, sent = None, headers
        if trace is not None:
            span, carrier = trace.attempt(
                name, decision.replica.url, attempt + 1, decision.branch, decision.total
            )
            sent = {**headers, **carrier}  # the replica joins the session's trace
        retry = attempt > 0 and not unsent
        pipeline.retrying(retry)
        try:
            async with asyncio.timeout(cfg.response_head_timeout_s):
                ws = await runtime.session.ws_connect(
                    url,
                    headers=sent,
                    max_msg_size=server.realtime_max_message_bytes,
                    timeout=aiohttp.ClientWSTimeout(
                        ws_receive=None, ws_close=cfg.connect_timeout_s
                    ),
                    autoping=True,
                )
        except aiohttp.WSServerHandshakeError as exc:
            # It answered, with a status: vLLM does so for a model without a realtime task.
            if span is not None:
                end_attempt(span, f"http_{exc.status}")
            pipeline.release(lease, None if exc.status < 500 else False)
            log.warning("replica %s refused the realtime upgrade: HTTP %d", name, exc.status)
            raise RealtimeUnsupported(
                f"The model server refused the realtime session (HTTP {exc.status}): "
                f"replica `{name}` has no /v1/realtime for model `{model}`."
            ) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            why = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
            if span is not None:
                end_attempt(span, why)
            pipeline.release(lease, False, type(exc).__name__)
            log.warning("realtime upgrade to %s failed: %s", name, type(exc).__name__)
            metrics.retry(name, why)
            tried.append(name)
            last = UpstreamFailed("The model server could not be reached.")
            unsent = isinstance(exc, aiohttp.ClientConnectorError)
            continue
        except BaseException:
            if span is not None:
                end_attempt(span, "cancelled")
            pipeline.release(lease, None)
            raise
        finally:
            pipeline.retrying(-retry)
        if span is not None:
            end_attempt(span, "ok")
        return Upstream(ws, lease), decision
    assert last is not None
    raise last


@dataclass(slots=True)
class Ending:
    """How a session ended: the side, the codes each side gets, and the metric's outcome."""

    outcome: str
    client_code: int | None  # None: the client is gone, nothing to send it
    client_reason: str
    upstream_code: int


@dataclass(frozen=True, slots=True)
class Flow:
    """The relay's companions: its counts, the client frames' rewrite, the drain's end."""

    tally: Tally
    # A client text frame as the replica gets it (a session.update's model, renamed).
    rename: Callable[[str], str]
    stop: asyncio.Event


def _count_usage(text: str, tally: Tally) -> None:
    """Add a transcription.done's usage (vLLM's UsageInfo) to the session's tally."""
    try:
        event = orjson.loads(text)
    except orjson.JSONDecodeError:
        return
    if not isinstance(event, dict) or event.get("type") != "transcription.done":
        return
    usage = event.get("usage")
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    if isinstance(total, int) and not isinstance(total, bool) and total >= 0:
        tally.usage(total)


def _is_created(text: str) -> bool:
    try:
        event = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return isinstance(event, dict) and event.get("type") == "session.created"


def _activity(loop: asyncio.AbstractEventLoop, last: list[float]) -> Callable[[], None]:
    def touch() -> None:
        last[0] = loop.time()

    return touch


async def relay(
    up: Upstream,
    receive: Receive,
    send: Send,
    idle_s: float,
    send_timeout_s: float,
    skip_created: bool,
    flow: Flow,
) -> Ending:
    """Frames both ways until a side closes, both idle `idle_s`, or `flow.stop` (drain) is set."""
    loop = asyncio.get_running_loop()
    last = [loop.time()]
    touch = _activity(loop, last)
    ws = up.ws
    tally, rename = flow.tally, flow.rename

    async def from_client() -> Ending:
        while True:
            msg: Message = await receive()
            if msg["type"] == "websocket.disconnect":
                code = msg.get("code", 1005)
                outcome = "message_too_big" if code == TOO_BIG else "client_closed"
                return Ending(outcome, None, "", to_upstream(code))
            touch()
            tally.frames_in += 1
            async with asyncio.timeout(send_timeout_s):
                text = msg.get("text")
                if text is not None:
                    await ws.send_str(rename(text))
                else:
                    await ws.send_bytes(msg.get("bytes") or b"")

    async def from_upstream() -> Ending:
        skip = skip_created
        while True:
            msg = await ws.receive()
            kind = msg.type
            if kind is aiohttp.WSMsgType.TEXT or kind is aiohttp.WSMsgType.BINARY:
                touch()
                if skip:
                    skip = False
                    # The client already holds the gateway's session.created.
                    if kind is aiohttp.WSMsgType.TEXT and _is_created(msg.data):
                        continue
                if kind is aiohttp.WSMsgType.TEXT and _DONE in msg.data:
                    _count_usage(msg.data, tally)
                tally.frames_out += 1
                out: Message = {"type": "websocket.send"}
                out["text" if kind is aiohttp.WSMsgType.TEXT else "bytes"] = msg.data
                await send(out)
                continue
            if kind is aiohttp.WSMsgType.CLOSE:
                code = msg.data if isinstance(msg.data, int) else None
                return Ending("upstream_closed", to_client(code), msg.extra or "", 1000)
            if kind is aiohttp.WSMsgType.ERROR and getattr(msg.data, "code", None) == TOO_BIG:
                text = "A message from the model server exceeded the size limit."
                return Ending("message_too_big", TOO_BIG, text, TOO_BIG)
            # CLOSED, ERROR: the socket broke without a close handshake.
            text = "The model server closed the connection."
            return Ending("upstream_error", BAD_GATEWAY, text, GOING_AWAY)

    async def idle() -> Ending:
        while True:
            left = last[0] + idle_s - loop.time()
            if left <= 0:
                text = f"No message either way for {idle_s:g} s."
                return Ending("idle_timeout", GOING_AWAY, text, GOING_AWAY)
            await asyncio.sleep(left)  # a timer: activity moves the deadline, not a signal

    async def drained() -> Ending:
        await flow.stop.wait()
        text = "The gateway is shutting down."
        return Ending("drained", SERVICE_RESTART, text, GOING_AWAY)

    return await _first(from_client(), from_upstream(), idle(), drained())


async def _first(*coros: Awaitable[Ending]) -> Ending:
    """The first of `coros` to finish; the others are cancelled (a failure counts as an end)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    task = next(iter(done))
    exc = task.exception()
    if exc is None:
        return task.result()
    if isinstance(exc, TimeoutError):
        text = "The model server stopped reading the session."
        return Ending("upstream_error", BAD_GATEWAY, text, GOING_AWAY)
    if isinstance(exc, OSError):  # uvicorn's ClientDisconnected, a reset upstream socket
        client_gone = tasks.index(task) == 1
        if client_gone:
            return Ending("client_closed", None, "", GOING_AWAY)
        text = "The model server closed the connection."
        return Ending("upstream_error", BAD_GATEWAY, text, GOING_AWAY)
    raise exc


async def close_upstream(up: Upstream, code: int) -> None:
    """Close the replica's socket with `code`, unless it is closed already."""
    if up.ws.closed:
        return
    with contextlib.suppress(OSError, TimeoutError):  # gone: nothing left to tell it
        await up.ws.close(code=code)
