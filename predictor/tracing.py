"""OpenTelemetry traces of the server: the one module that knows OpenTelemetry.

Off unless :func:`setup` is given an endpoint (``--otel_endpoint``, or the
standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``).
Off, nothing of OpenTelemetry is imported and every function here returns
``None`` or a shared no-op at once: the front door installs no middleware or
interceptor, and the model and device layers make no span objects.

On, each inference request is one span (``infer``, a child of the client's
W3C ``traceparent`` when it sends one) with children ``receive`` (the body
read; gRPC: the message parsed), ``decode`` (the codec and stage 1),
``queue_wait`` (submitted until its first batch starts) and ``answer`` (encode
and send). Each batch is one ``batch`` span with a link to every request it
carries, made where the device worker runs it
(:func:`predictor.model.forward.batch_forward`: the batcher knows no
protocol, the trace rides on each item as an opaque value), a child of its
oldest request's span, with children ``h2d`` (stack and copy to the device)
and ``forward``. Across front ends (``--frontends``) the request's
``traceparent`` crosses with its tiles and the device owner makes the
``queue_wait`` and ``batch`` spans under it. Attributes hold small scalars and
names only: never pixels, tokens, headers or bodies.

On CUDA the ``h2d`` and ``forward`` spans time what the worker's thread spends
(launches and the copies it waits for), not the device's own time.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

PROTOCOLS = ("http/protobuf", "grpc")
"""``--otel_protocol`` choices: OTLP over HTTP (protobuf bodies) or gRPC."""
TRACES_PATH = "/v1/traces"
"""Appended to an HTTP endpoint, as the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` is."""
SERVICE_NAME = "histoserve"

_tracer: Any = None  # the SDK's tracer once set up; None: tracing is off
_provider: Any = None
_otel: Any = None  # what the hot path uses of the API, imported once by setup
_NOOP = contextlib.nullcontext()
_ending = threading.Lock()  # a request's two batches may start at once on two workers
_current: ContextVar[RequestTrace | None] = ContextVar("histoserve_request_trace", default=None)


@dataclass(frozen=True)
class TracingSettings:
    """What :func:`setup` needs (the flags of :class:`predictor.config.TracingConfig`).

    Attributes:
        endpoint: OTLP endpoint; ``None``: the standard variables decide.
        protocol: ``http/protobuf`` or ``grpc``; ``None``: ``OTEL_EXPORTER_OTLP_PROTOCOL``,
            else HTTP.
        sample_ratio: Share of new traces recorded (a client's sampled flag is
            followed); ``None``: ``OTEL_TRACES_SAMPLER_ARG`` (with or without
            ``OTEL_TRACES_SAMPLER``), else 1.0.
        process: This process's role (``owner``, ``frontend-0``), an attribute of its spans.
    """

    endpoint: str | None = None
    protocol: str | None = None
    sample_ratio: float | None = None
    process: str = "server"


def configured_endpoint(endpoint: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """The endpoint tracing exports to: the flag's, else the standard variables', else ``None``.

    ``OTEL_SDK_DISABLED=true`` turns it off whatever is set.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if endpoint:
        return endpoint
    return env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")


def enabled() -> bool:
    """Whether spans are being made in this process."""
    return _tracer is not None


def setup(settings: TracingSettings, env: Mapping[str, str] = os.environ) -> bool:
    """Turns tracing on for this process when an endpoint is configured; returns whether it is.

    Imports the OpenTelemetry SDK and its OTLP exporter only here. The
    exporter runs in the SDK's batch span processor (its own thread, bounded
    queue; ``OTEL_BSP_*`` honoured), so a slow collector drops spans, never
    delays a request. The standard ``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_EXPORTER_OTLP_HEADERS`` are the SDK's.

    Raises:
        ConfigError: An unknown protocol, a ratio outside [0, 1], or the
            server extra's OpenTelemetry packages missing.
    """
    global _tracer, _provider, _otel
    from predictor.errors import ConfigError

    endpoint = configured_endpoint(settings.endpoint, env)
    if endpoint is None:
        return False
    protocol = (
        settings.protocol
        or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or (env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    )
    if protocol not in PROTOCOLS:
        raise ConfigError(f"otel_protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    ratio = settings.sample_ratio
    if ratio is None and not env.get("OTEL_TRACES_SAMPLER") and env.get("OTEL_TRACES_SAMPLER_ARG"):
        try:  # the ratio alone, without naming the sampler: ours, parent-based
            ratio = float(env["OTEL_TRACES_SAMPLER_ARG"])
        except ValueError:
            raise ConfigError(
                f"OTEL_TRACES_SAMPLER_ARG must be a number from 0 to 1, got "
                f"{env['OTEL_TRACES_SAMPLER_ARG']!r}"
            ) from None
    if ratio is not None and not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"otel_sample_ratio must be within [0, 1], got {ratio}")
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as exc:
        raise ConfigError(
            f"--otel_endpoint needs the OpenTelemetry SDK ({exc.name} is missing): "
            "install histoserve[server]"
        ) from exc
    resource = Resource.create(
        {
            "service.name": env.get("OTEL_SERVICE_NAME") or SERVICE_NAME,
            "histoserve.process": settings.process,
        }
    )
    sampler = ParentBased(TraceIdRatioBased(ratio)) if ratio is not None else None
    provider = TracerProvider(resource=resource, sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(_exporter(endpoint, protocol, env)))
    _provider = provider
    _otel = _Api(trace, TraceContextTextMapPropagator(), trace.Link, trace.SpanKind.SERVER)
    _tracer = provider.get_tracer("histoserve")
    return True


def _exporter(endpoint: str, protocol: str, env: Mapping[str, str]) -> Any:
    """The OTLP span exporter; an HTTP endpoint from the flag gets ``/v1/traces`` appended."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = endpoint.startswith("http://") or None
        return OTLPSpanExporter(endpoint=endpoint, insecure=insecure)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if endpoint != env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):  # a signal's own is used as is
        endpoint = endpoint.rstrip("/") + TRACES_PATH
    return OTLPSpanExporter(endpoint=endpoint)


def shutdown(timeout_s: float = 2.0) -> None:
    """Exports what is still buffered and stops (at the end of a drain); a no-op when off."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.force_flush(int(timeout_s * 1000))
        provider.shutdown()


@dataclass(frozen=True)
class _Api:
    trace: Any
    propagator: Any
    link: Any
    server_kind: Any


class RequestTrace:
    """One request's spans: its own, and the stages' children; the opaque value items carry.

    Made by :func:`start_request` at the front door (or by :func:`remote_request`
    in the device owner, where ``span`` is ``None`` and only the parent
    crosses). Methods are safe from the worker threads.
    """

    __slots__ = ("_answer", "_queue_wait", "context", "span", "span_context")

    def __init__(self, span: Any, context: Any, span_context: Any):
        self.span = span
        self.context = context
        self.span_context = span_context
        self._queue_wait: Any = None
        self._answer: Any = None

    def child(self, name: str, start_ns: int | None = None) -> Any:
        """A started child span (end it yourself)."""
        return _tracer.start_span(name, context=self.context, start_time=start_ns)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """A child span around a block; an error is recorded on it and re-raised."""
        with _tracer.start_as_current_span(name, context=self.context):
            yield

    def record(self, name: str, start_ns: int, end_ns: int) -> None:
        """A child span that already happened."""
        self.child(name, start_ns).end(end_ns)

    def queue_wait_started(self) -> None:
        """Submitted to the real batcher: ``queue_wait`` runs until its first batch starts."""
        if self._queue_wait is None:
            self._queue_wait = self.child("queue_wait")

    def batch_started(self, at_ns: int | None = None) -> None:
        """Its first batch starts (at ``at_ns``): ``queue_wait`` ends there."""
        with _ending:
            queue_wait, self._queue_wait = self._queue_wait, False
        if queue_wait:
            queue_wait.end(at_ns)

    def answer_started(self) -> None:
        """Encoding begins: ``answer`` runs until the front door has sent it."""
        if self._answer is None:
            self._answer = self.child("answer")

    def answer_sent(self) -> None:
        with _ending:
            answer, self._answer = self._answer, False
        if answer:
            answer.end()

    def traceparent(self) -> str:
        """The W3C ``traceparent`` of this request's span (what crosses to the device owner)."""
        ctx = self.span_context
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def end(self, error: BaseException | None = None, status_code: int | None = None) -> None:
        """Ends the request's span (and an ``answer`` or ``queue_wait`` still open)."""
        self.batch_started()
        self.answer_sent()
        if self.span is None:
            return
        if status_code is not None:
            self.span.set_attribute("http.response.status_code", status_code)
            if status_code >= 500 and error is None:
                status = _otel.trace.Status(_otel.trace.StatusCode.ERROR, str(status_code))
                self.span.set_status(status)
        if error is not None:
            self.span.set_attribute("error.type", type(error).__name__)
            status = _otel.trace.Status(_otel.trace.StatusCode.ERROR, type(error).__name__)
            self.span.set_status(status)
        self.span.end()


def start_request(
    protocol: str,
    carrier: Mapping[str, str] | None,
    model: str | None = None,
    start_ns: int | None = None,
) -> RequestTrace | None:
    """A request's span, a child of the client's ``traceparent`` in ``carrier``; None when off.

    ``None`` too when the sampler drops it: nothing more is made for it.
    """
    if _tracer is None:
        return None
    trace = _otel.trace
    parent = _otel.propagator.extract(carrier or {})
    attributes: dict[str, Any] = {"rpc.system": protocol}
    if model is not None:
        attributes["histoserve.model"] = model[:128]
    span = _tracer.start_span(
        "infer", context=parent, kind=_otel.server_kind, attributes=attributes, start_time=start_ns
    )
    if not span.is_recording():
        return None
    return RequestTrace(span, trace.set_span_in_context(span, parent), span.get_span_context())


def remote_request(traceparent: str | None) -> RequestTrace | None:
    """The device owner's handle on a front end's request: its spans go under ``traceparent``."""
    if _tracer is None or not traceparent:
        return None
    context = _otel.propagator.extract({"traceparent": traceparent})
    span_context = _otel.trace.get_current_span(context).get_span_context()
    if not span_context.is_valid:
        return None
    return RequestTrace(None, context, span_context)


def traceparent_of(trace: RequestTrace | None) -> str | None:
    """What crosses to the device owner with a request's tiles (None: not traced)."""
    return None if trace is None else trace.traceparent()


def current_request() -> RequestTrace | None:
    """The request being served in this task (set by the front door), or None."""
    if _tracer is None:
        return None
    return _current.get()


@contextlib.contextmanager
def serving(trace: RequestTrace) -> Iterator[RequestTrace]:
    """Makes ``trace`` the current request for the block (the front door's task)."""
    token = _current.set(trace)
    try:
        yield trace
    finally:
        _current.reset(token)


def stage(trace: RequestTrace | None, name: str) -> Any:
    """``trace``'s child span ``name`` around a block; a no-op when ``trace`` is None."""
    return _NOOP if trace is None else trace.stage(name)


def batch(traces: Iterable[RequestTrace | None], tiles: int, mode: str) -> Any:
    """The ``batch`` span around one forward, linked to each traced request it carries.

    A child of the first traced request (so a lone request's trace holds its
    batch) and current in the worker's thread while the forward runs, so
    :func:`span` children go under it. Ends each request's ``queue_wait``.
    A no-op context when off or when no item is traced.
    """
    if _tracer is None:
        return _NOOP
    distinct: dict[int, RequestTrace] = {}
    for trace in traces:
        if trace is not None and id(trace) not in distinct:
            distinct[id(trace)] = trace
    if not distinct:
        return _NOOP
    link = _otel.link
    started = time.time_ns()
    requests = list(distinct.values())
    for trace in requests:
        trace.batch_started(started)
    return _tracer.start_as_current_span(
        "batch",
        context=requests[0].context,
        links=[link(t.span_context) for t in requests],
        start_time=started,
        attributes={
            "histoserve.batch.tiles": tiles,
            "histoserve.batch.requests": len(requests),
            "histoserve.mode": mode,
        },
    )


def span(name: str) -> Any:
    """A child of the current span (a batch's ``h2d``, ``forward``); a no-op when off."""
    if _tracer is None:
        return _NOOP
    if not _otel.trace.get_current_span().is_recording():
        return _NOOP
    return _tracer.start_as_current_span(name)
