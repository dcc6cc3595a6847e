"""The llmgateway.v1.Inference servicer: each RPC goes through the same Pipeline as HTTP."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, NoReturn, Protocol

import grpc
import orjson

from gateway.errors import GatewayError, NoHealthyReplica
from gateway.grpc import convert
from gateway.grpc.gen import gateway_pb2 as pb
from gateway.grpc.gen import gateway_pb2_grpc as pb_grpc
from gateway.grpc.status import (
    DEADLINE,
    FAILED,
    TRUNCATED,
    GrpcFailure,
    from_gateway_error,
    from_stream_error,
    from_upstream,
)
from gateway.proxy.hints import apply as apply_hints
from gateway.proxy.identity import peer_host
from gateway.proxy.requests import Kind, ParsedRequest, parse_request
from gateway.proxy.upstream import Exchange, StreamBroken
from gateway.runtime import Runtime
from routing.types import Branch
from vllm_api.sse import DONE, SseError, SseParser

log = logging.getLogger("llm_gateway.grpc")

Metadata = tuple[tuple[str, str], ...]
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["Inference"].full_name
# The model label of a request that failed before its model was read (or of an unknown model).
_UNKNOWN_MODEL = "_unknown"


class Context(Protocol):
    """The part of grpc.aio.ServicerContext the servicer uses."""

    def invocation_metadata(self) -> convert.Metadata | None: ...

    def peer(self) -> str: ...

    def time_remaining(self) -> float | None: ...

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Metadata = ()
    ) -> NoReturn: ...

    async def send_initial_metadata(self, initial_metadata: Metadata) -> None: ...

    async def write(self, message: Any) -> None: ...


# time_remaining() of a call without a deadline is None or effectively infinite.
_NO_DEADLINE_S = 10.0 * 365 * 24 * 3600


def _remaining(context: Context) -> float | None:
    remaining = context.time_remaining()
    if remaining is None or remaining > _NO_DEADLINE_S:
        return None
    return max(remaining, 0.0)


class InferenceService(pb_grpc.InferenceServicer):
    """Completions and chat over gRPC; routing, retries and accounting stay in the pipeline."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        cfg = runtime.config.server
        self._rid_key = cfg.request_id_header.lower()
        # Data-plane keys ([server].api_keys and tenants' keys), trusted tenant metadata.
        self._tenancy = runtime.tenancy

    async def Complete(self, request: pb.CompletionRequest, context: Context) -> Any:
        return await self._call("completions", request, context, stream=False)

    async def StreamComplete(self, request: pb.CompletionRequest, context: Context) -> None:
        await self._call("completions", request, context, stream=True)

    async def Chat(self, request: pb.ChatRequest, context: Context) -> Any:
        return await self._call("chat", request, context, stream=False)

    async def StreamChat(self, request: pb.ChatRequest, context: Context) -> None:
        await self._call("chat", request, context, stream=True)

    async def ListModels(
        self, request: pb.ListModelsRequest, context: Context
    ) -> pb.ListModelsResponse:
        try:
            self._authorize(context.invocation_metadata() or ())
        except GatewayError as err:
            failure = from_gateway_error(err)
            await context.abort(failure.code, failure.message)
        return convert.model_list(self._runtime.pool.model_cards())

    def _authorize(self, metadata: convert.Metadata) -> str:
        """The tenant of the call's key ("default" when no keys are set); 401 without one."""
        return self._tenancy.identify(
            value for key, value in metadata if key == "authorization" and isinstance(value, str)
        )

    async def _call(
        self, kind: Kind, request: convert.Request, context: Context, stream: bool
    ) -> Any:
        started = time.perf_counter()
        metadata = context.invocation_metadata() or ()
        rid = convert.request_id(metadata, self._rid_key)
        parsed: ParsedRequest | None = None
        try:
            hints = convert.read_hints(metadata)
            tenant = self._authorize(metadata)
            if self._runtime.draining:
                raise NoHealthyReplica("The gateway is shutting down.")
            body = convert.request_body(kind, request, stream)
            parsed = apply_hints(parse_request(kind, body, rid), hints)
            # The peer's address only matters when some source may name the tenant.
            trusted = self._tenancy.trusts_headers and hints.tenant is not None
            peer = peer_host(context.peer()) if trusted else None
            parsed = self._tenancy.bind(parsed, tenant, hints, peer)
            # The client's deadline bounds routing, retries and the whole stream.
            deadline = asyncio.timeout(_remaining(context))
            try:
                async with deadline:
                    return await self._serve(parsed, list(hints.headers), started, context)
            except TimeoutError:
                if not deadline.expired():
                    raise
                raise GrpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE) from None
        except GatewayError as err:
            failure = from_gateway_error(err)
        except GrpcFailure as exc:
            failure = exc
        except Exception:
            # grpc would put the exception text in the status, and aiohttp's embed upstream URLs.
            log.exception("request %s: unexpected error", rid)
            failure = GrpcFailure(grpc.StatusCode.INTERNAL, FAILED)
            if parsed is None:  # past parsing, `_serve` or the pipeline counted it
                self._internal(_UNKNOWN_MODEL, started)
        await context.abort(failure.code, failure.message, failure.trailing_metadata(rid))

    async def _serve(
        self,
        req: ParsedRequest,
        headers: list[tuple[bytes, bytes]],
        started: float,
        context: Context,
    ) -> Any:
        pipeline = self._runtime.pipeline
        try:
            exchange = await pipeline.open(req, headers, started)
        except GatewayError:
            raise  # counted by the pipeline
        except Exception:
            log.exception("request %s: unexpected error while routing", req.request_id)
            known = req.model in self._runtime.pool.known_models()
            self._internal(req.model if known else _UNKNOWN_MODEL, started)
            raise GrpcFailure(grpc.StatusCode.INTERNAL, FAILED) from None
        ok = True
        try:
            if exchange.status != 200:
                raise from_upstream(exchange.status, exchange.first, exchange.response.headers)
            await context.send_initial_metadata((("x-request-id", req.request_id),))
            shape = convert.response_shape(req.kind, req.stream)
            if not req.stream:
                return self._decode_unary(shape, exchange)
            await self._relay(req, exchange, context, shape)
            return None
        except GrpcFailure as failure:
            ok = not failure.replica_fault
            raise
        finally:
            # Also on cancellation (client gone, deadline): closing the response cut the
            # upstream request, which is what frees the replica's slot.
            pipeline.finish(req, exchange, exchange.status, ok and exchange.status < 500)

    def _internal(self, model: str, started: float) -> None:
        """Count a request the gateway failed itself (as HTTP's 500) before any replica."""
        elapsed = time.perf_counter() - started
        self._runtime.metrics.request_done(model, "", 500, Branch.NONE, elapsed)

    @staticmethod
    def _decode_unary(shape: convert.Shape, exchange: Exchange) -> Any:
        try:
            data = orjson.loads(exchange.first)
        except orjson.JSONDecodeError:
            raise GrpcFailure(grpc.StatusCode.INTERNAL, FAILED, replica_fault=True) from None
        if not isinstance(data, dict):
            raise GrpcFailure(grpc.StatusCode.INTERNAL, FAILED, replica_fault=True)
        return convert.to_proto(shape, data)

    async def _relay(
        self, req: ParsedRequest, exchange: Exchange, context: Context, shape: convert.Shape
    ) -> None:
        parser = SseParser()
        done = False
        try:
            async for chunk in exchange.chunks():
                for data in parser.feed(chunk):
                    if done:
                        continue
                    if data == DONE:
                        done = True
                        continue
                    await context.write(self._event(data, shape))
        except (StreamBroken, SseError, GrpcFailure) as exc:
            reason = exc.reason if isinstance(exc, StreamBroken) else str(exc)
            self._truncated(req, exchange, reason)
            if isinstance(exc, GrpcFailure):
                raise
            raise GrpcFailure(grpc.StatusCode.UNAVAILABLE, TRUNCATED, replica_fault=True) from None
        if not done:
            # Without [DONE] the answer may be cut: say so rather than end with OK.
            self._truncated(req, exchange, "no [DONE]")
            raise GrpcFailure(grpc.StatusCode.UNAVAILABLE, TRUNCATED, replica_fault=True)

    @staticmethod
    def _event(data: bytes, shape: convert.Shape) -> Any:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise GrpcFailure(grpc.StatusCode.INTERNAL, TRUNCATED, replica_fault=True) from None
        if not isinstance(obj, dict):
            raise GrpcFailure(grpc.StatusCode.INTERNAL, TRUNCATED, replica_fault=True)
        if "error" in obj:
            raise from_stream_error(obj)
        return convert.to_proto(shape, obj)

    def _truncated(self, req: ParsedRequest, exchange: Exchange, reason: str) -> None:
        replica = exchange.lease.replica.name
        log.warning("request %s: stream from %s broke: %s", req.request_id, replica, reason)
        self._runtime.metrics.stream_truncated(req.model, replica)
