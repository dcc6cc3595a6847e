"""The audio routes' multipart reader on bodies as httpx (the openai SDK's client) writes them,
and the malformed ones it must refuse."""

from __future__ import annotations

import random

import httpx
import pytest

from gateway.errors import BadRequest
from gateway.proxy.multipart import MalformedMultipart, parse_form
from gateway.proxy.requests import parse_request


def _encoded(data: dict[str, str], files: dict[str, tuple[str, bytes, str]]) -> bytes:
    request = httpx.Request("POST", "http://x/", data=data, files=files)
    return request.read()


@pytest.mark.parametrize("seed", range(20))
def test_fields_and_file_sizes_of_client_bodies(seed: int) -> None:
    rng = random.Random(seed)
    # Audio bytes that contain CRLFs, dashes and fake boundaries must not end the part.
    audio = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 5000))) + b"\r\n--x\r\n"
    data = {"model": f"whisper-{seed}", "stream": rng.choice(["true", "false"]),
            "language": "en", "prompt": "line one\r\nline two"}  # fmt: skip
    form = parse_form(_encoded(data, {"file": ("a.wav", audio, "audio/wav")}))
    assert form.fields == data
    assert form.files == {"file": len(audio)}


def test_parse_request_reads_model_and_stream_only() -> None:
    body = _encoded({"model": "w", "stream": "True"}, {"file": ("a.wav", b"RIFF", "audio/wav")})
    req = parse_request("transcription", body, "rid")
    assert (req.model, req.stream, req.body) == ("w", True, body)
    assert req.features.prompt_tokens == 0 and req.features.block_hashes == ()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "does not start with a multipart boundary"),
        (b"model=w", "does not start with a multipart boundary"),
        (b"--xyz", "ends inside its first boundary line"),
        (b'--xyz\r\nContent-Disposition: form-data; name="model"\r\n\r\nw', "closing boundary"),
        (b"--xyz\r\nContent-Type: text/plain\r\n\r\nw\r\n--xyz--\r\n", "no Content-Disposition"),
        (b"--xyz\r\nContent-Disposition: form-data\r\n\r\nw\r\n--xyz--\r\n", 'no "name"'),
        (b"--xyz\r\nContent-Disposition: attachment; name=a\r\n\r\nw\r\n--xyz--", "not form-data"),
        (b"--" + b"b" * 71 + b"\r\n", "1-70 valid characters"),
    ],
)
def test_malformed_bodies_are_refused_with_the_reason(body: bytes, reason: str) -> None:
    with pytest.raises(MalformedMultipart, match=reason):
        parse_form(body)
    with pytest.raises(BadRequest, match="Invalid multipart/form-data body"):
        parse_request("transcription", body, "rid")


@pytest.mark.parametrize(
    ("data", "files", "param"),
    [
        ({"model": "w"}, {}, "file"),
        ({}, {"file": ("a.wav", b"x", "audio/wav")}, "model"),
        ({"model": "w", "stream": "maybe"}, {"file": ("a.wav", b"x", "audio/wav")}, "stream"),
        # A `file` sent as a text field is no file (vLLM answers 422 for it).
        ({"model": "w", "file": "abc"}, {"other": ("a.wav", b"x", "audio/wav")}, "file"),
    ],
)
def test_what_cannot_be_routed_is_a_400_naming_the_field(
    data: dict[str, str], files: dict[str, tuple[str, bytes, str]], param: str
) -> None:
    if not files:
        # httpx writes a urlencoded body without files: build the multipart one by hand.
        body = b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nw\r\n--b--\r\n'
    else:
        body = _encoded(data, files)
    with pytest.raises(BadRequest) as caught:
        parse_request("translation", body, "rid")
    assert caught.value.param == param
