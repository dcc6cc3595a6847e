"""A real transcription replica (the tiny Whisper of benchmarks/vllm_cpu, dummy weights): the
conformance suite's audio tests against it, and the openai SDK's audio calls through a
gateway whose replicas are the generative fleet and it.

With dummy weights and temperature 0 the text is one token repeated up to the model's
max_new_tokens (16): deterministic, so the gateway's answers must equal the replica's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import sys
import time
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import pytest_asyncio

from benchmarks.vllm_cpu import WHISPER_NAME, VllmCpuError, VllmFleet
from benchmarks.vllm_cpu.fleet import WHISPER_MIN_BLOCKS
from benchmarks.vllm_cpu.whisper_model import WHISPER_MAX_LEN
from gateway.config import ReplicaConfig
from gateway.process import running_gateway
from simulator.audio import SUPPORTED_LANGUAGES, WHISPER_LANGUAGES
from tests.conformance.helpers import wav
from tests.vllm.conftest import BLOCK_SIZE, TIMEOUT_S, gateway_config, run_conformance, wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(TIMEOUT_S)]

# vLLM behaviours the simulator's transcription runner deliberately does not copy (no test
# asserts them): the text and the detected language (they come from the weights), how many
# segments verbose_json finds, audio over 30 s split into windows, any format but PCM WAV.
KNOWN_DIFFERENCES: dict[str, str] = {}


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def whisper(fleet: VllmFleet) -> AsyncIterator[VllmFleet]:
    """One transcription replica, started once the generative fleet is up."""
    f = VllmFleet(
        1,
        runner="transcription",
        kv_events=False,
        lora=False,
        num_gpu_blocks=WHISPER_MIN_BLOCKS,
        block_size=BLOCK_SIZE,
        max_model_len=WHISPER_MAX_LEN,
        max_num_seqs=4,
        startup_timeout_s=300.0,
    )
    started = time.monotonic()
    async with f:
        print(f"whisper replica healthy in {time.monotonic() - started:.1f}s", file=sys.stderr)
        yield f


async def test_the_transcription_command_line() -> None:
    f = VllmFleet(1, runner="transcription", kv_events=False, lora=False,
                  num_gpu_blocks=WHISPER_MIN_BLOCKS, max_model_len=WHISPER_MAX_LEN)  # fmt: skip
    cmd = f.command(8000, None, None)
    assert cmd[cmd.index("--served-model-name") + 1] == f.model == WHISPER_NAME
    assert cmd[cmd.index("--model") + 1] == str(f.model_dir) and "whisper" in f.model_dir.name
    assert cmd[cmd.index("--max-model-len") + 1] == "448"
    assert "--runner" not in cmd and "--enable-prefix-caching" not in cmd
    assert "--enable-lora" not in cmd and "--kv-events-config" not in cmd
    with pytest.raises(VllmCpuError, match="neither kv_events nor lora"):
        VllmFleet(1, runner="transcription", num_gpu_blocks=WHISPER_MIN_BLOCKS, max_model_len=448)
    with pytest.raises(VllmCpuError, match="max_model_len <= 448"):
        VllmFleet(1, runner="transcription", kv_events=False, lora=False)


# Run by the engine's python: Whisper's languages in its transformers, and vLLM's own list
# (whisper_utils.py loaded alone: importing vllm would take 10 s).
_LANGUAGES_OF_VLLM = """
import importlib.util, json, site
from transformers.models.whisper.tokenization_whisper import LANGUAGES
path = site.getsitepackages()[0] + "/vllm/model_executor/models/whisper_utils.py"
spec = importlib.util.spec_from_file_location("whisper_utils", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps([list(LANGUAGES), list(module.ISO639_1_SUPPORTED_LANGS)]))
"""


async def test_the_simulator_and_the_tiny_whisper_have_vllms_languages() -> None:
    proc = await asyncio.create_subprocess_exec(
        str(VllmFleet(1).engine.python), "-c", _LANGUAGES_OF_VLLM,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    whisper_codes, supported = json.loads(out.decode().splitlines()[-1])
    assert tuple(whisper_codes) == WHISPER_LANGUAGES
    assert tuple(supported) == SUPPORTED_LANGUAGES


async def test_conformance_audio_tests_pass_against_real_vllm(
    fleet: VllmFleet, whisper: VllmFleet
) -> None:
    env = {
        "LLMGW_VLLM_URL": fleet.replicas[0].url,
        "LLMGW_VLLM_MODEL": fleet.model,
        "LLMGW_VLLM_BLOCK_SIZE": str(fleet.block_size),
        "LLMGW_VLLM_AUDIO_URL": whisper.replicas[0].url,
        "LLMGW_VLLM_AUDIO_MODEL": whisper.model,
    }
    target = "tests/conformance/test_audio.py"
    text = await run_conformance(env, KNOWN_DIFFERENCES, target, what="audio conformance vs vLLM")
    assert "deselected" not in text, text[-2000:]


async def test_openai_sdk_audio_through_the_gateway(fleet: VllmFleet, whisper: VllmFleet) -> None:
    base = gateway_config(fleet)
    asr = ReplicaConfig(url=whisper.replicas[0].url, name="vllm-whisper-0", kv_events="")
    cfg = dataclasses.replace(base, replicas=(*base.replicas, asr))
    async with (
        running_gateway(cfg) as gw,
        httpx.AsyncClient(base_url=whisper.replicas[0].url, timeout=60.0) as direct,
        openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0) as client,
    ):

        async def ready() -> bool:
            return all(r.healthy and r.models for r in gw.runtime.pool)

        await wait_until(ready, "the fleet and the whisper replica healthy at the gateway")
        model = whisper.model
        assert {fleet.model, model} <= {m.id for m in (await client.models.list()).data}
        audio = wav(2.5)

        async def own_raw(path: str = "/v1/audio/transcriptions", **form: str) -> str:
            files = {"file": ("a.wav", audio, "audio/wav")}
            r = await direct.post(path, data={"model": model, **form}, files=files)
            assert r.status_code == 200, r.text
            return r.text

        async def own(path: str, **form: str) -> dict[str, object]:
            out: dict[str, object] = json.loads(await own_raw(path, **form))
            return out

        want = await own("/v1/audio/transcriptions", language="en")
        result = await client.audio.transcriptions.create(
            model=model, file=("speech.wav", io.BytesIO(audio), "audio/wav"), language="en"
        )
        assert result.text == want["text"] and result.text
        assert result.model_dump()["usage"] == {"type": "duration", "seconds": 3}
        verbose = await client.audio.transcriptions.create(
            model=model, file=("s.wav", audio, "audio/wav"), language="en",
            response_format="verbose_json",
        )  # fmt: skip
        assert verbose.duration == pytest.approx(2.5) and verbose.language == "en"
        assert verbose.text == " ".join(s.text for s in verbose.segments or [])

        stream = await client.audio.transcriptions.create(
            model=model, file=("s.wav", audio, "audio/wav"), language="en", stream=True,
            extra_body={"stream_include_usage": True},
        )  # fmt: skip
        raw = [event.model_dump() async for event in stream]
        assert raw and all(e["object"] == "transcription.chunk" for e in raw)
        pieces = [c["delta"]["content"] for e in raw for c in e.get("choices") or []]
        assert "".join(pieces) == want["text"]
        assert raw[-2]["choices"][0]["finish_reason"] == "length"
        # The replica's own count for the same stream, not one token a chunk: under load vLLM
        # merges several steps' tokens into one delta (CI: 15 chunks carried 16 tokens).
        form = {"language": "en", "stream": "true", "stream_include_usage": "true"}
        events = [json.loads(x[6:]) for x in (await own_raw(**form)).splitlines() if x[6:7] == "{"]
        usage = events[-1]["usage"]
        assert raw[-1]["usage"] == usage and usage["prompt_tokens"] == 254
        assert usage["total_tokens"] == 254 + usage["completion_tokens"] >= 254 + len(pieces)

        want = await own("/v1/audio/translations")
        # The SDK marks translations deprecated; the call is unchanged.
        with pytest.warns(DeprecationWarning):
            translated = await client.audio.translations.create(
                model=model, file=("s.wav", audio, "audio/wav")
            )
        assert translated.text == want["text"]
        assert "usage" not in translated.model_dump(exclude_none=True)

        with pytest.raises(openai.BadRequestError, match="Invalid or corrupted audio data"):
            await client.audio.transcriptions.create(
                model=model, file=("s.mp3", b"ID3 not a wav", "audio/mpeg")
            )
        with pytest.raises(openai.BadRequestError, match="Unsupported language: 'xx'"):
            await client.audio.transcriptions.create(
                model=model, file=("s.wav", audio, "audio/wav"), language="xx"
            )
        # The generative model has no audio route: vLLM's 404 comes back through the gateway.
        with pytest.raises(openai.NotFoundError):
            await client.audio.transcriptions.create(
                model=fleet.model, file=("s.wav", audio, "audio/wav")
            )
