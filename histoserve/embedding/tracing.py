"""A slide's OpenTelemetry trace for ``histoserve embed --otel-endpoint``.

Each slide is one ``slide`` span with, per batch of tiles, ``read`` (the
reader thread's read), ``wait`` (read and queued until a sender takes it)
and ``send`` (the request, retries included: its ``traceparent`` travels
with it, :mod:`histoserve.tracecontext`, so the server's ``infer`` span and
its stages are its children), and one ``write`` (the slide's files).
Attributes are counts and batch indices only: no slide path or id, no pixels,
no token. OpenTelemetry is the ``histoserve[otel]`` extra, imported only when
the option is given; without it the option is a usage error.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from histoserve.errors import UsageError
from histoserve.tracecontext import carrying

SERVICE_NAME = "histoserve-embed"
TRACES_PATH = "/v1/traces"


class RunTracer:
    """The run's tracer provider (OTLP over HTTP, batched export in its own thread)."""

    def __init__(self, endpoint: str):
        try:
            from opentelemetry import trace
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise UsageError(
                f"--otel-endpoint needs OpenTelemetry ({exc.name} is missing): "
                "pip install 'histoserve[otel]'"
            ) from exc
        service = os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME
        self._provider = TracerProvider(resource=Resource.create({"service.name": service}))
        exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + TRACES_PATH)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("histoserve.embed")
        self._trace = trace

    @contextlib.contextmanager
    def slide(self, tiles: int) -> Iterator[SlideTrace]:
        """The ``slide`` span around one slide's work."""
        with self._tracer.start_as_current_span(
            "slide", attributes={"histoserve.tiles": tiles}
        ) as span:
            yield SlideTrace(self._tracer, self._trace.set_span_in_context(span))

    def close(self, timeout_s: float = 5.0) -> None:
        """Exports what is buffered, then stops."""
        self._provider.force_flush(int(timeout_s * 1000))
        self._provider.shutdown()


class SlideTrace:
    """One slide's spans, made from the reader and sender threads under its ``slide`` span."""

    def __init__(self, tracer: Any, context: Any):
        self._tracer = tracer
        self._context = context
        self._read_ns: dict[int, int] = {}
        self._lock = threading.Lock()

    def _span(self, name: str, index: int | None = None, start_ns: int | None = None) -> Any:
        attributes = {} if index is None else {"histoserve.batch": index}
        return self._tracer.start_span(
            name, context=self._context, attributes=attributes, start_time=start_ns
        )

    def reading(self, read: Callable[[int], Any]) -> Callable[[int], Any]:
        """``read`` with a ``read`` span per batch."""

        def traced(index: int) -> Any:
            span = self._span("read", index)
            try:
                return read(index)
            finally:
                span.end()
                with self._lock:
                    self._read_ns[index] = time.time_ns()

        return traced

    def sending(
        self, send: Callable[[Any, slice], Any], batch_size: int
    ) -> Callable[[Any, slice], Any]:
        """``send`` with a ``wait`` span (since its batch was read) and a ``send`` span."""

        def traced(tiles: Any, rows: slice) -> Any:
            index = rows.start // batch_size
            with self._lock:
                read_ns = self._read_ns.pop(index, None)
            if read_ns is not None:
                self._span("wait", index, read_ns).end()
            span = self._span("send", index)
            span.set_attribute("histoserve.tiles", len(tiles))
            ctx = span.get_span_context()
            traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
            try:
                with carrying(traceparent):
                    return send(tiles, rows)
            finally:
                span.end()

        return traced

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """The ``write`` span around the slide's files."""
        span = self._span("write")
        try:
            yield
        finally:
            span.end()
