"""Log output: JSON lines carry every field; the request record in both formats."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from gateway.logs import JsonFormatter, RequestLog, RequestRecord, setup_logging

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
    completion_tokens=8,
    duration_s=0.5,
    attempts=1,
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
    assert {k: data[k] for k in ("request_id", "tenant", "status", "ttft_s", "attempts")} == {
        "request_id": "req-1",
        "tenant": "acme",
        "status": 200,
        "ttft_s": 0.0123456,
        "attempts": 1,
    }


def test_setup_logging_replaces_the_root_handlers() -> None:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        setup_logging("warning", "json")
        assert len(root.handlers) == 1
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
        assert root.level == logging.WARNING
        setup_logging("info", "text")
        assert not isinstance(root.handlers[0].formatter, JsonFormatter)
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)
