"""OpenTelemetry traces: one server span per request, one client span per upstream attempt.

The only module that imports the OpenTelemetry SDK. W3C trace context comes in with the
client's `traceparent` and goes out to the replica as the attempt span's context, so a vLLM
started with `--otlp-traces-endpoint` joins the same trace. Export is OTLP over HTTP from the
SDK's batch processor thread: nothing on the event loop waits for a collector.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = (b"traceparent", b"tracestate")


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """Where and how much to trace (the gateway maps its config onto this)."""

    endpoint: str
    sample_ratio: float
    service_name: str = "llm-gateway"
    export_timeout_s: float = 5.0


class RequestTrace:
    """The spans of one request; every method is a no-op once the request span has ended."""

    __slots__ = ("_span", "_tracer")

    def __init__(self, tracer: trace.Tracer, span: Span) -> None:
        self._tracer = tracer
        self._span = span

    def set(self, **attributes: str | int | float | bool) -> None:
        self._span.set_attributes({f"llm_gateway.{k}": v for k, v in attributes.items()})

    def attempt(
        self, replica: str, url: str, number: int, branch: str, total: float
    ) -> tuple[Span, dict[str, str]]:
        """A client span for one upstream attempt, and the headers that carry it upstream."""
        ctx = trace.set_span_in_context(self._span)
        span = self._tracer.start_span(
            "upstream_attempt",
            context=ctx,
            kind=SpanKind.CLIENT,
            attributes={
                "llm_gateway.replica": replica,
                "server.address": url,
                # Why this attempt went there: the routing branch and the winner's total.
                "llm_gateway.attempt": number,
                "llm_gateway.branch": branch,
                "llm_gateway.total": total,
            },
        )
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return span, carrier

    def end(self, status: int) -> None:
        self._span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self._span.set_status(Status(StatusCode.ERROR))
        self._span.end()


def end_attempt(span: Span, outcome: str) -> None:
    """Close an attempt span with its outcome ("ok" or the failure reason)."""
    span.set_attribute("llm_gateway.outcome", outcome)
    if outcome != "ok":
        span.set_status(Status(StatusCode.ERROR, outcome))
    span.end()


class Tracing:
    """The process's tracer; `start` returns None when tracing is off or not sampled."""

    def __init__(self, settings: TracingSettings, exporter: SpanExporter | None = None) -> None:
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name}),
            sampler=ParentBasedTraceIdRatio(settings.sample_ratio),
        )
        exporter = exporter or OTLPSpanExporter(
            endpoint=settings.endpoint, timeout=settings.export_timeout_s
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("llm_gateway")

    def start(
        self,
        kind: str,
        headers: Iterable[tuple[bytes, bytes]],
        request_id: str,
        name: str | None = None,
    ) -> RequestTrace | None:
        """The request's server span; `name` replaces the one `kind` implies (a WebSocket)."""
        carrier = {
            k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in _TRACE_HEADERS
        }
        parent: Context | None = _PROPAGATOR.extract(carrier) if carrier else None
        span = self._tracer.start_span(
            name or f"POST /v1/{'chat/completions' if kind == 'chat' else 'completions'}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"llm_gateway.request_id": request_id},
        )
        if not span.is_recording():
            return None
        return RequestTrace(self._tracer, span)

    def flush(self, timeout_s: float = 5.0) -> bool:
        return self._provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self._provider.shutdown()


def inject_headers(headers: Mapping[str, str], carrier: Mapping[str, str]) -> dict[str, str]:
    """Upstream headers with the attempt's trace context replacing the client's."""
    out = {k: v for k, v in headers.items() if k not in ("traceparent", "tracestate")}
    out.update(carrier)
    return out
