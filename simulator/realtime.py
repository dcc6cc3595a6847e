"""/v1/realtime as vLLM 0.32 serves it (vllm/entrypoints/speech_to_text/realtime/).

A transcription replica accepts the socket and sends session.created; the client names the
model in session.update, appends base64 PCM16 audio (16 kHz mono), commits to start a
transcription and commits with final=true to end its audio; deltas stream as the audio is
"heard" and transcription.done carries the text and usage. Errors are error events, the
connection staying open. Text is derived from the audio bytes (the same audio transcribes
the same way) at a realtime model's rate; each token costs one simulated decode step.

Any other replica has no websocket route: uvicorn refuses the upgrade with a bare 403, and a
plain request gets Starlette's 404.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import time
import uuid
import weakref
import zlib
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import WSMsgType, web

from simulator.generation import reset
from simulator.http_util import REPLICA, replica_of

if TYPE_CHECKING:
    from simulator.replica import Replica

PATH = "/v1/realtime"
# uvicorn's default ws_max_size, which vLLM keeps.
_MAX_MESSAGE = 16 * 1024 * 1024
# vLLM's VLLM_MAX_AUDIO_CLIP_FILESIZE_MB default, which it compares to samples / 2**20.
_MAX_CHUNK_SAMPLES = 25 * 1024 * 1024
# A realtime model's text rate: one token per 80 ms of 16 kHz audio (Voxtral Realtime's frame).
_SAMPLES_PER_TOKEN = 1280


# Open sessions per replica: what a test watches to see a relay close its upstream side.
_OPEN: weakref.WeakKeyDictionary[Replica, int] = weakref.WeakKeyDictionary()
# The app's open sockets, closed as uvicorn closes them when the server stops.
_SOCKETS: web.AppKey[set[web.WebSocketResponse]] = web.AppKey("realtime_sockets")
# uvicorn's close code for its websockets at shutdown ("service restart").
_SERVICE_RESTART = 1012


def open_sessions(rep: Replica) -> int:
    """The realtime sessions open on `rep` now."""
    return _OPEN.get(rep, 0)


def _json(obj: dict[str, Any]) -> str:
    return orjson.dumps(obj).decode()


def _error(message: str, code: str) -> str:
    return _json({"type": "error", "error": message, "code": code})


class _Session:
    """One connection's state: its audio queue and the transcription being generated."""

    def __init__(self, rep: Replica, ws: web.WebSocketResponse) -> None:
        self.rep = rep
        self.ws = ws
        self.audio: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.validated = False

    async def handle(self, event: Any) -> None:
        if not isinstance(event, dict):
            # vLLM calls event.get(): an AttributeError, answered as a processing error.
            await self.ws.send_str(
                _error(
                    f"'{type(event).__name__}' object has no attribute 'get'", "processing_error"
                )
            )
            return
        kind = event.get("type")
        if kind == "session.update":
            model = event.get("model")
            if model is None:
                await self.ws.send_str(_error("Missing required field: model", "invalid_event"))
            elif model and model != self.rep.served[0]:
                # An empty name means the served model, as in vLLM's _is_model_supported.
                message = f"The model `{model}` does not exist."
                await self.ws.send_str(_error(message, "model_not_found"))
            else:
                self.validated = True
        elif kind == "input_audio_buffer.append":
            audio = event.get("audio")
            if not isinstance(audio, str):
                await self.ws.send_str(
                    _error("audio: a base64 string is required", "processing_error")
                )
                return
            try:
                raw = base64.b64decode(audio)
            except (binascii.Error, ValueError):
                raw = b""
            samples = len(raw) // 2
            if not raw or len(raw) % 2 or samples > _MAX_CHUNK_SAMPLES:
                await self.ws.send_str(_error("Invalid audio data", "invalid_audio"))
                return
            self.audio.put_nowait(raw)
        elif kind == "input_audio_buffer.commit":
            if not self.validated:
                message = (
                    "Model not validated. Make sure to validate the model by sending a "
                    "session.update event."
                )
                await self.ws.send_str(_error(message, "model_not_validated"))
                return
            final = event.get("final", False)
            if not isinstance(final, bool):
                await self.ws.send_str(_error("final: a boolean is required", "processing_error"))
                return
            if final:
                self.audio.put_nowait(None)
            elif self.task is None or self.task.done():
                self.task = asyncio.create_task(self._generate())
        else:
            await self.ws.send_str(_error(f"Unknown event type: {kind}", "unknown_event"))

    async def _generate(self) -> None:
        """Deltas as the audio arrives; done when a final commit ends it."""
        rep = self.rep
        step = rep.engine.timing.decode_s(1)
        text: list[str] = []
        prompt_tokens = heard = emitted = 0
        offset: int | None = None
        while (chunk := await self.audio.get()) is not None:
            if offset is None:
                offset = rep.vocab.offset([zlib.crc32(chunk)])
            heard += len(chunk) // 2
            due = heard // _SAMPLES_PER_TOKEN
            if not prompt_tokens and due > emitted:
                prompt_tokens = due
            while emitted < due:
                await asyncio.sleep(step)
                delta = rep.vocab.text(offset, emitted, emitted + 1)
                emitted += 1
                text.append(delta)
                if self.ws.closed:
                    return
                await self.ws.send_str(_json({"type": "transcription.delta", "delta": delta}))
        usage = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + emitted,
            "completion_tokens": emitted,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }
        done = {"type": "transcription.done", "text": "".join(text), "usage": usage}
        await self.ws.send_str(_json(done))
        while not self.audio.empty():  # the next utterance starts empty
            self.audio.get_nowait()

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


def _is_upgrade(request: web.Request) -> bool:
    connection = request.headers.get("Connection", "").lower()
    upgrade = request.headers.get("Upgrade", "").lower()
    return "upgrade" in connection and upgrade == "websocket"


async def realtime(request: web.Request) -> web.StreamResponse:
    if request.method != "GET" or not _is_upgrade(request):
        raise web.HTTPNotFound()  # no HTTP route at this path (FastAPI's 404 body)
    if replica_of(request).faults.reset_before_first_byte:
        return reset(request)  # the upgrade's connection cut before any answer
    ws = web.WebSocketResponse(max_msg_size=_MAX_MESSAGE, compress=False)
    await ws.prepare(request)
    rep = replica_of(request)
    session = _Session(rep, ws)
    _OPEN[rep] = _OPEN.get(rep, 0) + 1
    sockets = request.app[_SOCKETS]
    sockets.add(ws)
    created = {
        "type": "session.created",
        "id": f"sess-{uuid.uuid4().hex}",
        "created": int(time.time()),
    }
    await ws.send_str(_json(created))
    try:
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                try:
                    event = orjson.loads(msg.data)
                except orjson.JSONDecodeError:
                    await ws.send_str(_error("Invalid JSON", "invalid_json"))
                    continue
                await session.handle(event)
            elif msg.type is WSMsgType.BINARY:
                # vLLM reads text only: a binary frame ends its handler without a close frame.
                if request.transport is not None:
                    request.transport.close()
                break
    finally:
        _OPEN[rep] -= 1
        sockets.discard(ws)
        await session.close()
    return ws


async def refuse_upgrade(request: web.Request) -> web.StreamResponse:
    """A server without the realtime route: uvicorn's answer to an upgrade nothing accepts."""
    if request.method != "GET" or not _is_upgrade(request):
        raise web.HTTPNotFound()
    return web.Response(status=403, body=b"", content_type="text/plain", charset="utf-8")


def add_routes(app: web.Application) -> None:
    # vLLM registers /v1/realtime only for a model with the realtime task.
    if app[REPLICA].config.runner != "transcription":
        app.router.add_route("*", PATH, refuse_upgrade)
        return
    app[_SOCKETS] = set()
    app.on_shutdown.append(_close_all)
    app.router.add_route("*", PATH, realtime)


async def _close_all(app: web.Application) -> None:
    sockets: set[web.WebSocketResponse] = app[_SOCKETS]
    for ws in list(sockets):
        await ws.close(code=_SERVICE_RESTART)
