"""The official openai SDK's audio calls, unchanged, through the gateway to a simulated
transcription replica: transcriptions streamed and not, translations, and vLLM's errors."""

from __future__ import annotations

import io
import struct
from collections.abc import AsyncIterator

import openai
import pytest

from gateway.config import ReplicaConfig
from gateway.process import RunningGateway, running_gateway
from simulator import SimConfig, SimFleet
from tests.gateway.conftest import SIM, eventually, gateway_config

WHISPER = "sim-whisper"
AUDIO_SIM = SimConfig(model=WHISPER, runner="transcription", kv_events=False, time_scale=50.0)


def wav(seconds: float, rate: int = 16000) -> bytes:
    """A silent 16-bit mono PCM WAV file of `seconds`."""
    data = bytes(2 * round(seconds * rate))
    fmt = struct.pack("<HHIIHH", 1, 1, rate, 2 * rate, 2, 16)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data))
    return b"RIFF" + struct.pack("<I", 4 + len(chunks) + len(data)) + b"WAVE" + chunks + data


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    gen = SimFleet(SIM, replicas=1, host="127.0.0.1", base_port=0)
    aud = SimFleet(AUDIO_SIM, replicas=2, host="127.0.0.1", base_port=0)
    async with gen, aud:
        replicas = (
            *(ReplicaConfig(url=r.url, name=f"gen-{r.index}") for r in gen.replicas),
            *(ReplicaConfig(url=r.url, name=f"asr-{r.index}") for r in aud.replicas),
        )
        async with running_gateway(gateway_config(gen, replicas=replicas)) as running:
            await eventually(lambda: WHISPER in running.runtime.pool.known_models(), what="asr")
            yield running


@pytest.fixture
async def client(gw: RunningGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    async with sdk:
        yield sdk


async def test_transcription_json_and_verbose(client: openai.AsyncOpenAI) -> None:
    audio = ("speech.wav", io.BytesIO(wav(2.5)), "audio/wav")
    result = await client.audio.transcriptions.create(model=WHISPER, file=audio)
    assert result.text
    assert result.model_dump()["usage"] == {"type": "duration", "seconds": 3}
    verbose = await client.audio.transcriptions.create(
        model=WHISPER, file=("s.wav", wav(1.0), "audio/wav"), response_format="verbose_json"
    )
    assert verbose.duration == pytest.approx(1.0)
    assert verbose.language == "en" and verbose.segments


async def test_transcription_streamed(client: openai.AsyncOpenAI) -> None:
    stream = await client.audio.transcriptions.create(
        model=WHISPER, file=("s.wav", wav(3.0), "audio/wav"), stream=True,
        extra_body={"stream_include_usage": True},
    )  # fmt: skip
    events = [event async for event in stream]
    raw = [e.model_dump() for e in events]
    assert raw, "no events"
    # vLLM streams chat-like chunks ("transcription.chunk"), not OpenAI's typed events.
    pieces = [c["delta"]["content"] for e in raw for c in e.get("choices") or []]
    assert "".join(pieces)
    assert raw[0]["object"] == "transcription.chunk"
    assert raw[-2]["choices"][0]["finish_reason"] == "length"
    assert raw[-1]["usage"]["completion_tokens"] == len(pieces)


async def test_translation_and_vllms_errors(client: openai.AsyncOpenAI) -> None:
    # The SDK marks translations deprecated; the call is unchanged.
    with pytest.warns(DeprecationWarning):
        result = await client.audio.translations.create(
            model=WHISPER, file=("s.wav", wav(1.0), "audio/wav")
        )
    assert result.text and "usage" not in result.model_dump(exclude_none=True)
    with pytest.raises(openai.BadRequestError, match="Invalid or corrupted audio data"):
        await client.audio.transcriptions.create(
            model=WHISPER, file=("s.mp3", b"ID3 not a wav", "audio/mpeg")
        )
    with pytest.raises(openai.BadRequestError, match="Currently only support response_format"):
        await client.audio.transcriptions.create(
            model=WHISPER, file=("s.wav", wav(0.5), "audio/wav"), response_format="srt"
        )
