"""The audio routes as vLLM 0.32 serves them for a Whisper model (entrypoints/speech_to_text/).

Pinned on a real replica (tests/vllm/test_audio_vllm.py: the tiny Whisper of
benchmarks/vllm_cpu with dummy weights) and followed by the simulator's transcription runner.
What depends on trained weights is not asserted: the text itself, the language detected when
none is sent, how many segments verbose_json finds. A generative replica serves neither path.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from tests.conformance.helpers import Target, parse_sse, wav

T, R = "/v1/audio/transcriptions", "/v1/audio/translations"
_PATHS = (T, R)
_UNDECODABLE = (
    "Invalid or corrupted audio data. Ensure the input is a valid audio or video file "
    "(e.g. a complete WAV, MP3, or MP4)."
)
_SUPPORTED = (
    "'af', 'ar', 'hy', 'az', 'be', 'bs', 'bg', 'ca', 'zh', 'hr', 'cs', 'da', 'nl', 'en', 'et', "
    "'fi', 'fr', 'gl', 'de', 'el', 'he', 'hi', 'hu', 'is', 'id', 'it', 'ja', 'kn', 'kk', 'ko', "
    "'lv', 'lt', 'mk', 'ms', 'mr', 'mi', 'ne', 'no', 'fa', 'pl', 'pt', 'ro', 'ru', 'sr', 'sk', "
    "'sl', 'es', 'sw', 'sv', 'tl', 'ta', 'th', 'tr', 'uk', 'ur', 'vi', 'cy'"
)
_SEGMENT_KEYS = {"id", "avg_logprob", "compression_ratio", "end", "no_speech_prob", "seek",
                 "start", "temperature", "text", "tokens"}  # fmt: skip
# Whisper's decoder prompt <|startoftranscript|><|en|><|transcribe|><|notimestamps|>, plus
# vLLM's count of log-mel frames (one per 160 samples at 16 kHz).
_TASK_TOKENS = 4


def _prompt_tokens(seconds: float) -> int:
    return _TASK_TOKENS + math.ceil(seconds * 100)


async def _post(
    c: httpx.AsyncClient,
    path: str,
    data: dict[str, str],
    audio: bytes | None = None,
    *,
    file: bool = True,
) -> httpx.Response:
    files = {"file": ("a.wav", wav(1.0) if audio is None else audio, "audio/wav")}
    return await c.post(path, data=data, files=files if file else None)


def _json(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    out: dict[str, Any] = r.json()
    return out


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["code"] == status
    return err


@pytest.mark.parametrize("path", _PATHS)
async def test_a_generative_model_serves_no_audio_route(
    client: httpx.AsyncClient, target: Target, path: str
) -> None:
    r = await _post(client, path, {"model": target.model})
    assert r.status_code == 404, r.text


@pytest.mark.parametrize(("seconds", "billed"), [(1.0, 1), (2.5, 3), (0.01, 1), (0.0, 0)])
async def test_transcription_json_bills_whole_seconds(
    audio_client: httpx.AsyncClient, audio_target: Target, seconds: float, billed: int
) -> None:
    body = {"model": audio_target.model, "language": "en"}
    out = _json(await _post(audio_client, T, body, wav(seconds)))
    assert set(out) == {"text", "usage"} and isinstance(out["text"], str)
    assert out["usage"] == {"type": "duration", "seconds": billed}


async def test_response_format_text_is_still_json(
    audio_client: httpx.AsyncClient, audio_target: Target
) -> None:
    # vLLM 0.32 answers "text" with the JSON object (OpenAI sends plain text).
    body = {"model": audio_target.model, "language": "en", "response_format": "text"}
    out = _json(await _post(audio_client, T, body))
    assert out["usage"] == {"type": "duration", "seconds": 1}


async def test_without_model_or_language_the_served_model_detects_one(
    audio_client: httpx.AsyncClient,
) -> None:
    out = _json(await _post(audio_client, T, {}))
    assert set(out) == {"text", "usage"}
    verbose = _json(await _post(audio_client, R, {"response_format": "verbose_json"}))
    assert f"'{verbose['language']}'" in _SUPPORTED


@pytest.mark.parametrize("path", _PATHS)
async def test_verbose_json_shape(
    audio_client: httpx.AsyncClient, audio_target: Target, path: str
) -> None:
    # Sampling with a seed: random weights then emit timestamp tokens, so segments appear.
    body = {"model": audio_target.model, "language": "de", "response_format": "verbose_json",
            "temperature": "1.0", "seed": "1", "max_completion_tokens": "64"}  # fmt: skip
    out = _json(await _post(audio_client, path, body, wav(2.5)))
    assert set(out) == {"duration", "language", "text", "segments", "words"}
    assert out["duration"] == pytest.approx(2.5) and out["language"] == "de"
    assert out["words"] is None and out["segments"]
    for i, seg in enumerate(out["segments"]):
        assert set(seg) == _SEGMENT_KEYS and seg["id"] == i and seg["seek"] == 0
        # Not start <= end: random weights emit timestamps out of order.
        assert min(seg["start"], seg["end"]) >= 0.0 and seg["temperature"] == 1.0
        assert all(isinstance(t, int) for t in seg["tokens"]) and seg["no_speech_prob"] is None
    assert out["text"] == " ".join(seg["text"] for seg in out["segments"])


async def test_translation_json_has_no_usage(
    audio_client: httpx.AsyncClient, audio_target: Target
) -> None:
    out = _json(await _post(audio_client, R, {"model": audio_target.model}))
    assert set(out) == {"text"}
    out = _json(await _post(audio_client, R, {"model": audio_target.model, "language": "de"}))
    assert set(out) == {"text"}


async def _stream(c: httpx.AsyncClient, path: str, data: dict[str, str], audio: bytes) -> Any:
    r = await _post(c, path, {**data, "stream": "true"}, audio)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    sse = parse_sse(r.content)
    assert sse.done
    return sse.chunks


@pytest.mark.parametrize(("path", "task"), [(T, "transcription"), (R, "translation")])
async def test_streamed_chunks_and_final_usage(
    audio_client: httpx.AsyncClient, audio_target: Target, path: str, task: str
) -> None:
    body = {"model": audio_target.model, "stream_include_usage": "true",
            "max_completion_tokens": "3"}  # fmt: skip
    chunks = await _stream(audio_client, path, body, wav(2.5))
    prefix = "transcribe-" if task == "transcription" else "translate-"
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith(prefix)
    for c in chunks:
        assert c["object"] == f"{task}.chunk" and c["model"] == audio_target.model
    *content, last = chunks
    assert all(set(c) == {"id", "object", "created", "model", "choices"} for c in content)
    for c in content[:-1]:
        assert c["choices"] == [{"delta": {"content": c["choices"][0]["delta"]["content"]}}]
    end = content[-1]["choices"][0]
    assert end["finish_reason"] == "length" and end["stop_reason"] is None
    assert last["choices"] == [] and set(last) == {"id", "object", "created", "model",
                                                   "choices", "usage"}  # fmt: skip
    prompt = _prompt_tokens(2.5)
    assert last["usage"] == {"prompt_tokens": prompt, "total_tokens": prompt + 3,
                             "completion_tokens": 3}  # fmt: skip


async def test_stream_without_usage_ends_on_the_finish_chunk(
    audio_client: httpx.AsyncClient, audio_target: Target
) -> None:
    body = {"model": audio_target.model, "language": "en", "max_completion_tokens": "2"}
    chunks = await _stream(audio_client, T, body, wav(1.0))
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_continuous_usage_counts_every_chunk(
    audio_client: httpx.AsyncClient, audio_target: Target
) -> None:
    body = {"model": audio_target.model, "language": "en", "stream_include_usage": "true",
            "stream_continuous_usage_stats": "true", "max_completion_tokens": "3"}  # fmt: skip
    # 8 kHz stereo: vLLM resamples to 16 kHz mono; the frames follow the duration.
    chunks = await _stream(audio_client, T, body, wav(1.0, rate=8000, channels=2))
    prompt = _prompt_tokens(1.0)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == [1, 2, 3, 3] and chunks[-1]["choices"] == []
    for c in chunks:
        assert c["usage"]["prompt_tokens"] == prompt
        assert c["usage"]["total_tokens"] == prompt + c["usage"]["completion_tokens"]


async def test_a_header_only_wav_is_zero_seconds(
    audio_client: httpx.AsyncClient, audio_target: Target
) -> None:
    body = {"model": audio_target.model, "language": "en", "stream_include_usage": "true",
            "max_completion_tokens": "1"}  # fmt: skip
    chunks = await _stream(audio_client, T, body, wav(0.0, data=b""))
    assert chunks[-1]["usage"]["prompt_tokens"] == _TASK_TOKENS


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "items"), [(T, 15), (R, 14)])
async def test_a_missing_file_is_a_validation_error(
    audio_client: httpx.AsyncClient, audio_target: Target, path: str, items: int
) -> None:
    r = await _post(audio_client, path, {"model": audio_target.model, "language": "en"},
                    file=False)  # fmt: skip
    err = _error(r, 400)
    assert err["message"] == (
        "1 validation error:\n  {'type': 'missing', 'loc': 'body.file', 'msg': 'Field required', "
        f"'input': '<dict of {items} items>'}}"
    )
    assert (err["type"], err["param"]) == ("Bad Request", "body.file")


async def test_a_file_sent_as_text_is_422(
    audio_client: httpx.AsyncClient, audio_target: Target
) -> None:
    body = {"model": audio_target.model, "file": "abc"}
    err = _error(await _post(audio_client, T, body, file=False), 422)
    assert err["message"] == "Expected 'file' to be a file-like object, not 'str'."
    assert err["type"] == "Unprocessable Entity"


@pytest.mark.parametrize("path", _PATHS)
async def test_an_unknown_model_is_404(
    audio_client: httpx.AsyncClient, audio_target: Target, path: str
) -> None:
    err = _error(await _post(audio_client, path, {"model": "nope"}), 404)
    assert err["message"] == (
        f"The model `nope` does not exist. Valid aliases: {audio_target.model}."
    )
    assert (err["type"], err["param"]) == ("NotFoundError", "model")


@pytest.mark.parametrize("path", _PATHS)
@pytest.mark.parametrize(
    ("audio", "message"),
    [
        (b"ID3 not a wav", _UNDECODABLE),
        (b"RIFF" + bytes(100), _UNDECODABLE),
        (b"", _UNDECODABLE),
        # A WAV header with no data chunk: soundfile opens it, then no decoder reads it.
        (wav(1.0)[:36], "Invalid or unsupported audio file."),
    ],
)
async def test_bytes_no_decoder_reads_are_400(
    audio_client: httpx.AsyncClient, audio_target: Target, path: str, audio: bytes, message: str
) -> None:
    for stream in ("false", "true"):
        body = {"model": audio_target.model, "language": "en", "stream": stream}
        err = _error(await _post(audio_client, path, body, audio), 400)
        assert (err["message"], err["type"], err["param"]) == (message, "BadRequestError", None)


@pytest.mark.parametrize("language", ["xx", "EN", "english"])
async def test_a_language_whisper_lacks_is_400(
    audio_client: httpx.AsyncClient, audio_target: Target, language: str
) -> None:
    for path in _PATHS:
        body = {"model": audio_target.model, "language": language}
        err = _error(await _post(audio_client, path, body), 400)
        assert (
            err["message"] == f"Unsupported language: '{language}'.  Must be one of [{_SUPPORTED}]."
        )
        assert (err["type"], err["param"]) == ("BadRequestError", None)


async def test_whispers_other_languages_are_accepted(
    audio_client: httpx.AsyncClient, audio_target: Target
) -> None:
    # Not in vLLM's supported list but a Whisper language: a warning in vLLM's log only.
    for language in ("yue", "haw", "la"):
        body = {"model": audio_target.model, "language": language}
        assert set(_json(await _post(audio_client, T, body))) == {"text", "usage"}


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ("srt", "Currently only support response_format: `text`, `json`, `verbose_json` or "
                "`diarized_json`"),
        ("vtt", "Currently only support response_format: `text`, `json`, `verbose_json` or "
                "`diarized_json`"),
        ("diarized_json", "Currently do not support diarized_json for {model}"),
    ],
)  # fmt: skip
async def test_formats_whisper_refuses(
    audio_client: httpx.AsyncClient, audio_target: Target, fmt: str, message: str
) -> None:
    body = {"model": audio_target.model, "language": "en", "response_format": fmt}
    err = _error(await _post(audio_client, T, body), 400)
    assert err["message"] == message.format(model=audio_target.model)
    assert (err["type"], err["param"]) == ("BadRequestError", None)


async def test_an_unknown_format_is_a_validation_error(
    audio_client: httpx.AsyncClient, audio_target: Target
) -> None:
    plain = "'json', 'text', 'srt', 'verbose_json' or 'vtt'"
    literal = (
        "{'type': 'literal_error', 'loc': 'body.response_format', 'msg': \"Input should be "
        + plain
        + "\", 'input': '%s', 'ctx': {'expected': \""
        + plain
        + '"}}'
    )
    diarized = (
        "{'type': 'literal_error', 'loc': 'body.response_format', 'msg': \"Input should be "
        "'diarized_json'\", 'input': 'xml', 'ctx': {'expected': \"'diarized_json'\"}}"
    )
    body = {"model": audio_target.model, "response_format": "xml"}
    err = _error(await _post(audio_client, T, body), 400)
    assert err["message"] == f"2 validation errors:\n  {literal % 'xml'}\n  {diarized}"
    assert (err["type"], err["param"]) == ("Bad Request", "body.response_format")
    # Translations have no diarized_json at all.
    body = {"model": audio_target.model, "response_format": "diarized_json"}
    err = _error(await _post(audio_client, R, body), 400)
    assert err["message"] == f"1 validation error:\n  {literal % 'diarized_json'}"


async def test_stream_option_errors(audio_client: httpx.AsyncClient, audio_target: Target) -> None:
    m = {"model": audio_target.model, "language": "en"}
    err = _error(await _post(audio_client, T, {**m, "stream_include_usage": "true"}), 400)
    assert err["message"] == (
        "Stream options can only be defined when `stream=True`. (parameter=stream_include_usage)"
    )
    assert (err["type"], err["param"]) == ("BadRequestError", "stream_include_usage")
    err = _error(await _post(audio_client, T, {**m, "stream": "maybe"}), 400)
    assert err["message"] == (
        "1 validation error:\n  {'type': 'bool_parsing', 'loc': 'body.stream', 'msg': 'Input "
        "should be a valid boolean, unable to interpret input', 'input': 'maybe'}"
    )
    assert (err["type"], err["param"]) == ("Bad Request", "body.stream")
    body = {**m, "stream": "true", "response_format": "verbose_json"}
    err = _error(await _post(audio_client, T, body), 400)
    assert err["message"] == "verbose_json format doesn't support streaming case"
