"""nginx as a vLLM-shaped upstream that costs next to nothing: fixed replies from files.

Two server blocks in one single-process nginx (`master_process off`, so one pid holds its CPU):
the JSON port answers POST /v1/chat/completions with a fixed ~400-byte chat completion and
POST /v1/completions with a completions reply; the stream port answers both with an SSE stream
of `chunks` deltas then `data: [DONE]`. nginx cannot read the body's `"stream"` flag, hence two
ports. Every event is padded to the same size and nginx reads the file through one output
buffer of exactly that size (sendfile off, postpone_output 0), so each event is its own write,
as a replica's engine steps are (the answer has a content-length, not chunked encoding). Both
ports serve GET /health, /metrics (a small vLLM exposition) and /v1/models for the gateway's
health and score loops and the peers' probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from benchmarks.overhead_procs import BenchProcessError, free_ports, wait_ready
from benchmarks.procs import stop_process
from benchmarks.static_upstream import MODEL, chat_completion, stream_events
from benchmarks.system_deps import which

# Each SSE event padded to this many bytes: one output buffer, one write.
EVENT_BYTES = 256
_CREATED = 1_700_000_000

_METRICS = f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.0
"""


def completions_reply() -> bytes:
    """A fixed /v1/completions answer, vLLM's shape."""
    return orjson.dumps(
        {
            "id": "cmpl-0123456789abcdef0123456789abcdef",
            "object": "text_completion",
            "created": _CREATED,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "text": " The quick brown fox jumps over the lazy dog.",
                    "logprobs": None,
                    "finish_reason": "stop",
                    "stop_reason": None,
                    "prompt_logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": 6, "total_tokens": 18, "completion_tokens": 12},
        }
    )


def padded_stream(chunks: int) -> bytes:
    """The SSE answer, every event padded (spaces before its blank line) to EVENT_BYTES."""
    out = []
    for event in stream_events(chunks):
        data = event[:-2]  # without the "\n\n"
        if len(data) + 2 > EVENT_BYTES:
            raise ValueError(f"an SSE event of {len(event)} bytes exceeds {EVENT_BYTES}")
        out.append(data + b" " * (EVENT_BYTES - len(data) - 2) + b"\n\n")
    return b"".join(out)


def models_reply() -> bytes:
    """GET /v1/models with the one benchmark model."""
    card = {"id": MODEL, "object": "model", "created": _CREATED, "owned_by": "vllm"}
    return orjson.dumps({"object": "list", "data": [{**card, "root": MODEL, "parent": None}]})


def write_files(root: Path, chunks: int) -> None:
    """The replies nginx serves, under `root`."""
    (root / "chat.json").write_bytes(chat_completion())
    (root / "completions.json").write_bytes(completions_reply())
    (root / "stream.sse").write_bytes(padded_stream(chunks))
    (root / "models.json").write_bytes(models_reply())
    (root / "metrics.txt").write_text(_METRICS)
    (root / "health").write_bytes(b"")


def _server(host: str, port: int, stream: bool) -> str:
    # nginx's static module refuses POST (405): error_page turns the 405 into a 200 and an
    # internal GET of the reply's file.
    chat, completions = ("stream.sse", "stream.sse") if stream else ("chat", "completions")
    return f"""
    server {{
        listen {host}:{port} backlog=1024;
        location = /v1/chat/completions {{ error_page 405 =200 /{chat}; return 405; }}
        location = /v1/completions {{ error_page 405 =200 /{completions}; return 405; }}
        location = /chat {{ internal; default_type application/json; try_files /chat.json =500; }}
        location = /completions {{
            internal; default_type application/json; try_files /completions.json =500;
        }}
        location = /stream.sse {{ internal; default_type text/event-stream; }}
        location = /v1/models {{ default_type application/json; try_files /models.json =404; }}
        location = /metrics {{ default_type text/plain; try_files /metrics.txt =404; }}
        location = /health {{ try_files /health =404; }}
        location / {{ return 404; }}
    }}"""


def nginx_config(root: Path, host: str, json_port: int, stream_port: int) -> str:
    """nginx.conf: one process, no logs, keep-alive without limits, one write per SSE event."""
    temp = "\n".join(
        f"    {name}_temp_path {root / ('tmp_' + name)};"
        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""daemon off;
master_process off;
worker_processes 1;
pid {root / "nginx.pid"};
error_log stderr warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    root {root};
{temp}
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
    sendfile off;
    tcp_nopush off;
    tcp_nodelay on;
    postpone_output 0;
    output_buffers 1 {EVENT_BYTES};
    etag off;
    server_tokens off;
{_server(host, json_port, False)}
{_server(host, stream_port, True)}
}}
"""


@dataclass(frozen=True, slots=True)
class Nginx:
    """The running nginx: its ports and its one process."""

    host: str
    json_port: int
    stream_port: int
    pid: int

    def url(self, stream: bool) -> str:
        """Base URL of the port serving JSON answers or SSE streams."""
        return f"http://{self.host}:{self.stream_port if stream else self.json_port}"


def nginx_binary() -> str | None:
    """The nginx executable, or None when it is not installed."""
    return which("nginx")


@contextlib.asynccontextmanager
async def nginx(host: str, chunks: int) -> AsyncIterator[Nginx]:
    """Run nginx (a non-daemon child) on two free ports until the block exits."""
    exe = nginx_binary()
    if exe is None:
        raise BenchProcessError("nginx is not installed (benchmarks/system_deps.py installs it)")
    with tempfile.TemporaryDirectory(prefix="llm-gw-nginx-") as tmp:
        root = Path(tmp)
        write_files(root, chunks)
        json_port, stream_port = free_ports(host, 2)
        conf = root / "nginx.conf"
        conf.write_text(nginx_config(root, host, json_port, stream_port))
        log = root / "nginx.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                exe, "-p", str(root), "-e", "stderr", "-c", str(conf), stdout=out, stderr=out
            )
        try:
            for port in (json_port, stream_port):
                await wait_ready("nginx", proc, log, host, port, "/health")
            yield Nginx(host, json_port, stream_port, proc.pid)
        finally:
            await stop_process(proc)
