"""A transcription replica's routes (vLLM 0.32 speech_to_text/, a Whisper-type model):
/v1/audio/transcriptions and /v1/audio/translations, multipart forms, JSON or SSE answers.

The audio is never decoded: its duration is read from a PCM WAV header (any other file is
"Invalid or unsupported audio file.", as vLLM answers audio it cannot decode); the encoder's
input (50 positions a second, Whisper's 1500 per 30 s window) is prefilled and about three
tokens a second of speech decoded through the simulated engine, so timing follows the size.
"""

from __future__ import annotations

import hashlib
import math
import struct
import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from simulator import generation as G
from simulator import protocol as P
from simulator.http_util import api_error_response, error_response, json_response, replica_of
from vllm_api.sse import DONE_EVENT

if TYPE_CHECKING:
    from simulator.replica import Replica

# The fields with a non-None default in vLLM's request models: FastAPI's form dict holds them
# and the fields sent (vLLM's validation message counts its items).
_DEFAULTS = {
    "transcription": frozenset(
        {
            "prompt",
            "response_format",
            "timestamp_granularities[]",
            "stream",
            "stream_include_usage",
            "stream_continuous_usage_stats",
            "use_beam_search",
            "n",
            "length_penalty",
            "include_stop_str_in_output",
            "temperature",
            "frequency_penalty",
            "presence_penalty",
        }
    ),
}
_DEFAULTS["translation"] = _DEFAULTS["transcription"] - {"timestamp_granularities[]"}
_FORMATS = {
    "transcription": ("json", "text", "srt", "verbose_json", "vtt", "diarized_json"),
    "translation": ("json", "text", "srt", "verbose_json", "vtt"),
}
_ENCODER_POSITIONS_PER_S = 50
_DECODER_PROMPT = 4
_TOKENS_PER_S = 3.0


def wav_duration(data: bytes) -> float:
    """Seconds of audio in a RIFF/WAVE file; ValueError for anything else."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("Invalid or unsupported audio file.")
    at, byte_rate, size = 12, 0, None
    while at + 8 <= len(data):
        chunk, length = data[at : at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if chunk == b"fmt " and length >= 16:
            byte_rate = struct.unpack_from("<I", data, at + 16)[0]
        elif chunk == b"data":
            size = min(length, len(data) - at - 8)
            break
        at += 8 + length + (length & 1)
    if byte_rate <= 0 or size is None:
        raise ValueError("Invalid or unsupported audio file.")
    return float(size) / float(byte_rate)


def _form_error(task: str, sent: set[str], extra: list[dict[str, Any]]) -> P.ApiError:
    count = len(_DEFAULTS[task] | sent)
    missing = {"type": "missing", "loc": "body.file", "msg": "Field required",
               "input": f"<dict of {count} items>"}  # fmt: skip
    return P.validation_errors([missing, *extra])


def _check(task: str, form: dict[str, Any], has_file: bool) -> tuple[str, bool, bool]:
    """(response_format, stream, include_usage) after vLLM's form validation."""
    if isinstance(form.get("file"), str):
        raise P.ApiError(422, "Expected 'file' to be a file-like object, not 'str'.",
                         "Unprocessable Entity")  # fmt: skip
    errors: list[dict[str, Any]] = []
    fmt = form.get("response_format", "json")
    if fmt not in _FORMATS[task]:
        plain = _FORMATS["translation"]
        expected = ", ".join(f"'{f}'" for f in plain[:-1]) + f" or '{plain[-1]}'"
        msg = f"Input should be {expected}"
        errors.append(
            P.field_error("literal_error", "response_format", msg, fmt, expected=expected)
        )
        if task == "transcription":
            errors.append(P.field_error("literal_error", "response_format",
                                        "Input should be 'diarized_json'", fmt,
                                        expected="'diarized_json'"))  # fmt: skip
    flags: dict[str, bool] = {}
    for key in ("stream", "stream_include_usage"):
        try:
            flags[key] = P.lax_bool(form, key, False)
        except P.ApiError:
            msg = "Input should be a valid boolean, unable to interpret input"
            errors.append(P.field_error("bool_parsing", key, msg, form[key]))
    if not has_file:
        raise _form_error(task, set(form), errors)
    if errors:
        raise P.validation_errors(errors)
    if flags["stream_include_usage"] and not flags["stream"]:
        msg = "Stream options can only be defined when `stream=True`."
        raise P.bad_request(msg, "stream_include_usage")
    return str(fmt), flags["stream"], flags["stream_include_usage"]


def _refusal(rep: Replica, model: str, fmt: str, stream: bool) -> str | None:
    """_create_speech_to_text's checks after the form's (Whisper: no diarization)."""
    if fmt not in ("text", "json", "verbose_json", "diarized_json"):
        return ("Currently only support response_format: `text`, `json`, `verbose_json` or "
                "`diarized_json`")  # fmt: skip
    if fmt == "diarized_json":
        return f"Currently do not support diarized_json for {model}"
    if fmt == "verbose_json" and stream:
        return "verbose_json format doesn't support streaming case"
    return None


async def _serve(request: web.Request, task: str) -> web.StreamResponse:
    rep = replica_of(request)
    if (early := await G.early_answer(request, rep)) is not None:
        return early
    try:
        posted = await request.post()
    except ValueError:
        return json_response({"detail": "Invalid multipart data."}, 400)
    form: dict[str, Any] = {}
    audio: bytes | None = None
    for key, value in posted.items():
        if key == "file" and isinstance(value, web.FileField):
            if audio is None:
                audio = value.file.read()
        elif isinstance(value, str) and key not in form:
            form[key] = value
    try:
        fmt, stream, include_usage = _check(task, form, audio is not None)
        assert audio is not None
        model = form.get("model") or rep.served[0]
        if model not in rep.served:
            raise P.ApiError(404, f"The model `{model}` does not exist. Valid aliases: "
                             f"{rep.served[0]}.", "NotFoundError", "model")  # fmt: skip
        refusal = _refusal(rep, model, fmt, stream)
        if refusal is not None:
            raise P.bad_request(refusal)
        duration = wav_duration(audio)
    except P.ApiError as exc:
        return api_error_response(exc)
    except ValueError as exc:
        return error_response(400, str(exc))
    digest = hashlib.blake2b(audio, digest_size=8).digest()
    seed = int.from_bytes(digest, "little")
    length = _DECODER_PROMPT + max(1, round(duration * _ENCODER_POSITIONS_PER_S))
    ids = [(seed >> (i % 48)) % 2000 + i % 7 for i in range(length)]
    cap = form.get("max_completion_tokens")
    wanted = max(1, math.ceil(duration * _TOKENS_PER_S))
    if isinstance(cap, str) and cap.isdigit() and int(cap) > 0:
        wanted = min(wanted, int(cap))
    base = request.headers.get("X-Request-Id") or digest.hex()
    request_id = f"{'transcribe' if task == 'transcription' else 'translate'}-{base}"
    # The audio is its own cache key: Whisper's encoder output is not prefix-cached.
    req = G.new_request(rep, ids, model=model, request_id=request_id,
                        max_tokens=min(wanted, rep.config.max_model_len),
                        cache_salt=request_id)  # fmt: skip
    rep.engine.submit(req)
    choice = G.Choice(0, req, rep.vocab.offset(ids))
    rep.inflight += 1
    try:
        if stream:
            return await _stream(request, rep, choice, task, model, include_usage)
        text = await G.complete(rep, choice)
    except G.EngineFailure as failure:
        return G.failure_answer(request, failure)
    finally:
        rep.inflight -= 1
        if not req.done:
            rep.engine.finish(req, "abort")
    return json_response(_answer(task, fmt, text, duration, form, choice))


def _answer(
    task: str, fmt: str, text: str, duration: float, form: dict[str, Any], c: G.Choice
) -> dict[str, Any]:
    if fmt == "verbose_json":
        temperature = float(form.get("temperature") or 0.0)
        segment = {"id": 0, "avg_logprob": -0.25, "compression_ratio": 1.0, "end": duration,
                   "no_speech_prob": None, "seek": 0, "start": 0.0,
                   "temperature": temperature, "text": text,
                   "tokens": list(range(c.offset, c.offset + c.sent))}  # fmt: skip
        return {"duration": duration, "language": form.get("language") or "en",
                "text": text, "segments": [segment], "words": None}  # fmt: skip
    if task == "translation":
        return {"text": text}  # vLLM reports no usage for translations
    return {"text": text, "usage": {"type": "duration", "seconds": math.ceil(duration)}}


async def _stream(
    request: web.Request,
    rep: Replica,
    c: G.Choice,
    task: str,
    model: str,
    include_usage: bool,
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    top = {"id": c.req.request_id, "object": f"{task}.chunk", "created": int(time.time()),
           "model": model}  # fmt: skip
    while c.finish is None:
        failure = await G.next_chunk(rep, c)
        if failure is not None:
            if failure.kind == "restart":
                G.reset(request)
                return resp
            err = {"error": {"message": str(failure), "type": "InternalServerError",
                             "param": None, "code": 500}}  # fmt: skip
            await resp.write(b"data: " + orjson.dumps(err) + b"\n\n" + DONE_EVENT)
            return resp
        piece = G.advance(rep, c, ())
        choice: dict[str, Any] = {"delta": {"content": piece}}
        if c.finish is not None:
            choice.update(finish_reason=c.finish, stop_reason=c.stop_reason)
        await resp.write(b"data: " + orjson.dumps({**top, "choices": [choice]}) + b"\n\n")
    if include_usage:
        prompt = len(c.req.prompt_ids)
        usage = {"prompt_tokens": prompt, "total_tokens": prompt + c.sent,
                 "completion_tokens": c.sent}  # fmt: skip
        await resp.write(b"data: " + orjson.dumps({**top, "choices": [], "usage": usage}) + b"\n\n")
    await resp.write(DONE_EVENT)
    await resp.write_eof()
    return resp


async def transcriptions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "transcription")


async def translations(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "translation")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/audio/translations", translations)
