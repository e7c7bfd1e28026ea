"""The front door's request spans (:mod:`predictor.tracing`), REST and gRPC alike.

Installed only when tracing is on (:func:`predictor.tracing.enabled`), so a
server without ``--otel_endpoint`` runs none of this. Each starts the
request's span from the client's W3C ``traceparent`` (a header, or gRPC
metadata), times ``receive`` and ends ``answer`` once the answer is sent, and
makes the trace the current request of the task that runs the model.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
from grpc import aio

from predictor import tracing

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
"""The one gRPC method traced: V2 inference."""
_CARRIED = (b"traceparent",)
"""The client's trace context taken in: ``traceparent`` only (``tracestate`` is vendor
state we never read, and OpenTelemetry's parser logs a warning quoting each malformed
member: a client could fill the log, one line a request)."""


def traced_route(scope: dict) -> bool:
    """An inference route: ``POST .../infer`` (V2) or ``POST ...:predict`` (V1)."""
    if scope["type"] != "http" or scope.get("method") != "POST":
        return False
    path: str = scope["path"]
    return path.endswith("/infer") or path.endswith(":predict")


def _model_of(path: str) -> str | None:
    parts = path.split("/")
    if "models" in parts and parts.index("models") + 1 < len(parts):
        return parts[parts.index("models") + 1].split(":")[0]
    return None


class TracingMiddleware:
    """ASGI: one span per inference request, ``receive`` and ``answer`` timed at the socket.

    Outside the fast path (:class:`~predictor.kserve.fast_infer.FastInferMiddleware`),
    so both the fast path and FastAPI's route run inside the request's span.
    """

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if not traced_route(scope):
            await self.app(scope, receive, send)
            return
        carrier = {
            k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _CARRIED
        }
        trace = tracing.start_request("http", carrier, _model_of(scope["path"]))
        if trace is None:  # not sampled
            await self.app(scope, receive, send)
            return
        first_ns = 0
        received = False
        status: int | None = None

        async def timed_receive() -> dict:
            nonlocal first_ns, received
            if not first_ns:
                first_ns = time.time_ns()
            message = await receive()
            if not received and not message.get("more_body", False):
                received = True
                trace.record("receive", first_ns, time.time_ns())
            return message

        async def timed_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                trace.answer_sent()

        error: BaseException | None = None
        try:
            with tracing.serving(trace):
                await self.app(scope, timed_receive, timed_send)
        except BaseException as exc:
            error = exc
            raise
        finally:
            trace.end(error, status)


class GrpcTracingInterceptor(aio.ServerInterceptor):
    """gRPC: one span per ``ModelInfer``; ``receive`` is the message parsed from the wire."""

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or details.method != MODEL_INFER or handler.unary_unary is None:
            return handler
        metadata = {k: v for k, v in details.invocation_metadata or () if k == "traceparent"}
        parse, behavior = handler.request_deserializer, handler.unary_unary
        parsed: list[int] = []

        def timed_parse(data: bytes) -> Any:
            parsed.append(time.time_ns())
            message = parse(data) if parse is not None else data
            parsed.append(time.time_ns())
            return message

        async def traced(request: Any, context: Any) -> Any:
            start_ns = parsed[0] if parsed else None
            model = getattr(request, "model_name", None)
            trace = tracing.start_request("grpc", metadata, model, start_ns)
            if trace is None:
                return await behavior(request, context)
            if len(parsed) == 2:
                trace.record("receive", parsed[0], parsed[1])
            error: BaseException | None = None
            try:
                with tracing.serving(trace):
                    return await behavior(request, context)
            except BaseException as exc:
                error = exc
                raise
            finally:
                trace.end(error)

        return grpc.unary_unary_rpc_method_handler(
            traced,
            request_deserializer=timed_parse,
            response_serializer=handler.response_serializer,
        )
