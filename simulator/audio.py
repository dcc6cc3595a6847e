"""A transcription replica's routes (vLLM 0.32 speech_to_text/, a Whisper-type model):
/v1/audio/transcriptions and /v1/audio/translations, multipart forms, JSON or SSE answers.

The audio is never decoded: its duration is read from a PCM WAV header (any other file is
refused as vLLM refuses bytes no decoder opens, a WAV without fmt or data as it refuses a
WAV it cannot read). The prompt is what vLLM counts in usage, Whisper's 4 task tokens plus
one per 10 ms log-mel frame (hop 160 at 16 kHz); it is prefilled through the simulated
engine and about three tokens a second of speech are decoded, so timing follows the size.
Checked against vLLM 0.32 serving a tiny Whisper (tests/vllm/test_audio_vllm.py).
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
_FRAMES_PER_S = 100
_DECODER_PROMPT = 4
_TOKENS_PER_S = 3.0
_UNDECODABLE = (
    "Invalid or corrupted audio data. Ensure the input is a valid audio or video file "
    "(e.g. a complete WAV, MP3, or MP4)."
)
_UNREADABLE_WAV = "Invalid or unsupported audio file."
# Whisper's language tokens, in its order (the tiny Whisper of benchmarks/vllm_cpu has them).
_WHISPER_CODES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no "
    "th ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw "
    "gl mr pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl "
    "mg as tt haw ln ha ba jw su yue"
)
WHISPER_LANGUAGES = tuple(_WHISPER_CODES.split())
# vLLM's ISO639_1_SUPPORTED_LANGS for Whisper, in its order (its refusal lists them); the
# rest of WHISPER_LANGUAGES is accepted with a warning in its log.
_SUPPORTED_CODES = (
    "af ar hy az be bs bg ca zh hr cs da nl en et fi fr gl de el he hi hu is id it ja kn kk ko "
    "lv lt mk ms mr mi ne no fa pl pt ro ru sr sk sl es sw sv tl ta th tr uk ur vi cy"
)
SUPPORTED_LANGUAGES = tuple(_SUPPORTED_CODES.split())


def wav_duration(data: bytes) -> float:
    """Seconds of audio in a RIFF/WAVE file; ValueError for anything else."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(_UNDECODABLE)
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
        # A WAV file by its header that no decoder reads: soundfile's refusal, then PyAV's.
        raise ValueError(_UNREADABLE_WAV)
    return float(size) / float(byte_rate)


def _form_error(task: str, sent: set[str], extra: list[dict[str, Any]]) -> P.ApiError:
    count = len(_DEFAULTS[task] | sent)
    missing = {"type": "missing", "loc": "body.file", "msg": "Field required",
               "input": f"<dict of {count} items>"}  # fmt: skip
    return P.validation_errors([missing, *extra])


def _check(task: str, form: dict[str, Any], has_file: bool) -> tuple[str, dict[str, bool]]:
    """(response_format, the stream flags) after vLLM's form validation."""
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
    for key in ("stream", "stream_include_usage", "stream_continuous_usage_stats"):
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
    return str(fmt), flags


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
        fmt, flags = _check(task, form, audio is not None)
        stream = flags["stream"]
        assert audio is not None
        model = form.get("model") or rep.served[0]
        if model not in rep.served:
            raise P.ApiError(404, f"The model `{model}` does not exist. Valid aliases: "
                             f"{rep.served[0]}.", "NotFoundError", "model")  # fmt: skip
        refusal = _refusal(rep, model, fmt, stream)
        if refusal is not None:
            raise P.bad_request(refusal)
        language = _language(form)
        duration = wav_duration(audio)
    except P.ApiError as exc:
        return api_error_response(exc)
    except ValueError as exc:
        return error_response(400, str(exc))
    digest = hashlib.blake2b(audio, digest_size=8).digest()
    seed = int.from_bytes(digest, "little")
    length = _DECODER_PROMPT + math.ceil(duration * _FRAMES_PER_S)
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
            usage = flags["stream_include_usage"]
            every = usage and flags["stream_continuous_usage_stats"]
            return await _stream(request, rep, choice, task, model, (usage, every))
        text = await G.complete(rep, choice)
    except G.EngineFailure as failure:
        return G.failure_answer(request, failure)
    finally:
        rep.inflight -= 1
        if not req.done:
            rep.engine.finish(req, "abort")
    return json_response(_answer(task, fmt, text, duration, language, form, choice))


def _language(form: dict[str, Any]) -> str | None:
    """validate_language of vLLM's Whisper: its languages, Whisper's others, or a 400."""
    language = form.get("language")
    if language is None or language in WHISPER_LANGUAGES:
        return language
    listed = ", ".join(f"'{code}'" for code in SUPPORTED_LANGUAGES)
    raise ValueError(f"Unsupported language: {language!r}.  Must be one of [{listed}].")


def _answer(
    task: str,
    fmt: str,
    text: str,
    duration: float,
    language: str | None,
    form: dict[str, Any],
    c: G.Choice,
) -> dict[str, Any]:
    if fmt == "verbose_json":
        temperature = float(form.get("temperature") or 0.0)
        segment = {"id": 0, "avg_logprob": -0.25, "compression_ratio": 1.0, "end": duration,
                   "no_speech_prob": None, "seek": 0, "start": 0.0,
                   "temperature": temperature, "text": text,
                   "tokens": list(range(c.offset, c.offset + c.sent))}  # fmt: skip
        # Without a language vLLM detects one; the simulated model always hears English.
        return {"duration": duration, "language": language or "en",
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
    usage: tuple[bool, bool],
) -> web.StreamResponse:
    """vLLM's chunks; usage: (a final usage chunk, usage on every chunk too)."""
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
        chunk: dict[str, Any] = {**top, "choices": [choice]}
        if usage[1]:
            chunk["usage"] = _usage(c)
        await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    if usage[0]:
        last = {**top, "choices": [], "usage": _usage(c)}
        await resp.write(b"data: " + orjson.dumps(last) + b"\n\n")
    await resp.write(DONE_EVENT)
    await resp.write_eof()
    return resp


def _usage(c: G.Choice) -> dict[str, int]:
    prompt = len(c.req.prompt_ids)
    return {"prompt_tokens": prompt, "total_tokens": prompt + c.sent, "completion_tokens": c.sent}


async def transcriptions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "transcription")


async def translations(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "translation")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/audio/translations", translations)
