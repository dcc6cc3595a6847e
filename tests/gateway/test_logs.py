"""Log output: JSON lines carry every field; the request record in both formats."""

from __future__ import annotations

import io
import logging
from dataclasses import replace

import httpx
import orjson
import pytest

from gateway.logs import JsonFormatter, RequestLog, RequestRecord, setup_logging
from gateway.process import running_gateway
from simulator import SimFleet
from tests.gateway.conftest import STORY, eventually, gateway_config

RECORD = RequestRecord(
    request_id="req-1",
    tenant="acme",
    model="m",
    replica="r0",
    branch="prefix_hit",
    status=200,
    stream=True,
    ttft_s=0.0123456,
    prompt_tokens=12,
    usage_tokens=20,
    duration_s=0.5,
)


@pytest.fixture
def captured() -> io.StringIO:
    return io.StringIO()


def _handler(out: io.StringIO, fmt: logging.Formatter) -> logging.Handler:
    handler = logging.StreamHandler(out)
    handler.setFormatter(fmt)
    return handler


def test_json_lines_carry_message_fields_and_traceback(captured: io.StringIO) -> None:
    log = logging.getLogger("test.json")
    log.addHandler(_handler(captured, JsonFormatter()))
    log.setLevel(logging.INFO)
    log.propagate = False
    log.info("replica %s is down: %s", "r1", "timeout", extra={"replica": "r1"})
    try:
        raise ValueError('boom "quoted"\nnewline')
    except ValueError:
        log.exception("failed")
    first, second = (orjson.loads(line) for line in captured.getvalue().splitlines())
    assert first["msg"] == "replica r1 is down: timeout"
    assert (first["level"], first["logger"], first["replica"]) == ("INFO", "test.json", "r1")
    assert first["ts"].endswith("Z")
    assert second["level"] == "ERROR"
    assert "ValueError" in second["exc"]
    assert len(captured.getvalue().splitlines()) == 2  # the newline stayed inside its line


def test_the_request_record_is_logfmt_in_text_and_keys_in_json(captured: io.StringIO) -> None:
    log = logging.getLogger("llm_gateway.request")
    log.propagate = False
    log.setLevel(logging.INFO)
    handler = _handler(captured, logging.Formatter("%(message)s"))
    log.addHandler(handler)
    try:
        RequestLog(enabled=True).done(RECORD)
        handler.setFormatter(JsonFormatter())
        RequestLog(enabled=True).done(RECORD)
        RequestLog(enabled=False).done(RECORD)  # off: nothing
    finally:
        log.removeHandler(handler)
        log.propagate = True
    text, js = captured.getvalue().splitlines()
    assert text.startswith("request_id=req-1 tenant=acme model=m replica=r0 branch=prefix_hit")
    assert "ttft_s=0.0123 " in text and "stream=True" in text
    data = orjson.loads(js)
    assert data["msg"] == "request"
    fields = ("request_id", "tenant", "status", "ttft_s", "usage_tokens")
    assert {k: data[k] for k in fields} == {
        "request_id": "req-1",
        "tenant": "acme",
        "status": 200,
        "ttft_s": 0.0123456,
        "usage_tokens": 20,
    }


def test_setup_logging_replaces_the_root_handlers() -> None:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        for h in list(root.handlers):
            root.removeHandler(h)
        setup_logging("warning", "json")
        assert len(root.handlers) == 1
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
        assert root.level == logging.WARNING
        setup_logging("info", "text")  # its own handler: replaced
        assert len(root.handlers) == 1
        assert not isinstance(root.handlers[0].formatter, JsonFormatter)
        # Someone else's root logger (an embedding program, pytest): left as it is.
        for h in list(root.handlers):
            root.removeHandler(h)
        foreign = logging.NullHandler()
        root.addHandler(foreign)
        setup_logging("debug", "json")
        assert root.handlers == [foreign] and root.level == logging.INFO
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)


async def test_each_request_is_one_record_served_or_refused(
    fleet: SimFleet, caplog: pytest.LogCaptureFixture
) -> None:
    base = gateway_config(fleet)
    cfg = replace(base, telemetry=replace(base.telemetry, request_log=True))
    caplog.set_level(logging.INFO, logger="llm_gateway.request")
    async with running_gateway(cfg) as gw, httpx.AsyncClient(base_url=gw.url) as client:
        chat = {**STORY, "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream(
            "POST", "/v1/chat/completions", json=chat, headers={"x-request-id": "r-ok"}
        ) as resp:
            assert resp.status_code == 200
            body = b"".join([c async for c in resp.aiter_bytes()])
        assert body.endswith(b"data: [DONE]\n\n")
        bad = {**STORY, "model": "no-such-model"}
        resp = await client.post(
            "/v1/chat/completions", json=bad, headers={"x-request-id": "r-404"}
        )
        assert resp.status_code == 404
        await eventually(
            lambda: sum(r.name == "llm_gateway.request" for r in caplog.records) >= 2,
            what="two request records",
        )
    records = [r for r in caplog.records if r.name == "llm_gateway.request"]
    ok, refused = (r.__dict__ for r in records)
    assert (ok["request_id"], ok["status"], ok["stream"], ok["tenant"]) == (
        "r-ok",
        200,
        True,
        "default",
    )
    assert ok["replica"] in {r.name for r in fleet.replicas} and ok["branch"]
    assert ok["ttft_s"] is not None and 0 < ok["ttft_s"] <= ok["duration_s"]
    assert ok["usage_tokens"] and ok["usage_tokens"] > 0
    assert (refused["request_id"], refused["status"], refused["replica"]) == ("r-404", 404, "")
    assert refused["ttft_s"] is None


async def test_no_record_unless_asked(fleet: SimFleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="llm_gateway.request")
    async with (
        running_gateway(gateway_config(fleet)) as gw,
        httpx.AsyncClient(base_url=gw.url) as c,
    ):
        assert (await c.post("/v1/chat/completions", json=STORY)).status_code == 200
    assert not [r for r in caplog.records if r.name == "llm_gateway.request"]
