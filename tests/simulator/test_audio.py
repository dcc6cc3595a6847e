"""The simulator's reading of an upload's duration (simulator/audio.py), without decoding it:
vLLM's figures (usage seconds, prompt tokens) follow the samples actually present."""

from __future__ import annotations

import struct

import pytest

from simulator.audio import SUPPORTED_LANGUAGES, WHISPER_LANGUAGES, wav_duration
from tests.conformance.helpers import wav


@pytest.mark.parametrize(
    ("audio", "seconds"),
    [
        (wav(1.0), 1.0),
        (wav(0.5, rate=44100), 0.5),
        (wav(1.0, rate=8000, channels=2), 1.0),
        (wav(0.0, data=b""), 0.0),
        # A data chunk declared longer than the file: what arrived is what is counted.
        (wav(1.0)[:5000], (5000 - 44) / 32000),
    ],
)
def test_duration_from_the_samples_present(audio: bytes, seconds: float) -> None:
    assert wav_duration(audio) == pytest.approx(seconds)


def test_chunks_before_data_are_skipped_with_their_pad_byte() -> None:
    audio = wav(1.0)
    odd = b"LIST" + struct.pack("<I", 3) + b"abc" + b"\0"
    spliced = audio[:36] + odd + audio[36:]
    assert wav_duration(spliced) == pytest.approx(1.0)


@pytest.mark.parametrize("audio", [b"", b"ID3 not a wav", b"RIFF" + bytes(100)])
def test_what_is_not_a_wav_is_refused_as_no_decoder_opens_it(audio: bytes) -> None:
    with pytest.raises(ValueError, match="Invalid or corrupted audio data"):
        wav_duration(audio)


@pytest.mark.parametrize("audio", [wav(1.0)[:36], b"RIFF\0\0\0\0WAVEdata"])
def test_a_wav_without_fmt_or_data_is_refused_as_unreadable(audio: bytes) -> None:
    with pytest.raises(ValueError, match="Invalid or unsupported audio file"):
        wav_duration(audio)


def test_vllms_languages_are_whisper_languages() -> None:
    assert len(WHISPER_LANGUAGES) == len(set(WHISPER_LANGUAGES)) == 100
    assert len(SUPPORTED_LANGUAGES) == 57 and set(SUPPORTED_LANGUAGES) <= set(WHISPER_LANGUAGES)
