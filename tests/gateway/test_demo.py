"""`llm-gateway demo` as a user runs it: a real process, real requests (the official SDK's
chat, embeddings and audio calls too), a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai

from tests.gateway.http.test_audio_sdk import wav


def test_demo_serves_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "demo",
            "--port",
            "0",
            "--grpc-port",
            "0",
            "--replicas",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 60
        curl = None
        while time.monotonic() < deadline and curl is None:
            line = proc.stdout.readline()
            assert line, "demo exited before printing its URL"
            if line.startswith("llm-gateway demo: "):
                url = line.split()[2]
            if line.strip().startswith("curl ") and url:
                curl = line
        assert url and curl and "/v1/chat/completions" in curl
        r = httpx.post(
            url + "/v1/chat/completions",
            json={
                "model": "sim-llama-3-8b",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 8,
            },
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        with sdk:
            # The demo's other models answer once their replicas are healthy at the gateway.
            for _ in range(300):
                if {"sim-embed", "sim-whisper"} <= {m.id for m in sdk.models.list()}:
                    break
                time.sleep(0.05)  # polling the gateway's model list under a bound
            emb = sdk.embeddings.create(model="sim-embed", input=["a", "b"])
            assert len(emb.data) == 2 and emb.data[0].embedding
            text = sdk.audio.transcriptions.create(model="sim-whisper", file=("a.wav", wav(1.0)))
            assert text.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()  # else an unclosed-pipe ResourceWarning fails the suite
