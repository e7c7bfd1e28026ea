"""A loopback OTLP/HTTP trace receiver: what a collector is told, decoded, for the tests.

A real ``POST /v1/traces`` endpoint (``application/x-protobuf``, decoded with
``opentelemetry-proto``'s own messages), so the server's exporter runs
exactly as against a collector. Each span is kept as a :class:`Span`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Span:
    """One received span, ids in hex."""

    name: str
    trace_id: str
    span_id: str
    parent: str
    links: tuple[str, ...]
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return (
        getattr(v, kind)
        if kind in ("string_value", "int_value", "double_value", "bool_value")
        else v
    )


class OtlpReceiver:
    """``http://127.0.0.1:PORT``: an OTLP/HTTP endpoint (``/v1/traces``) keeping what it gets.

    ``keep=False`` (a benchmark's sink) decodes each body but keeps only the count (``received``).
    """

    def __init__(self, keep: bool = True) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self.spans: list[Span] = []
        self.bodies = 0
        self.received = 0
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                spans = [
                    Span(
                        s.name,
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        tuple(link.span_id.hex() for link in s.links),
                        {a.key: _value(a.value) for a in s.attributes},
                        {a.key: _value(a.value) for a in rs.resource.attributes},
                    )
                    for rs in request.resource_spans
                    for ss in rs.scope_spans
                    for s in ss.spans
                ]
                with lock:
                    if keep:
                        receiver.spans.extend(spans)
                    receiver.received += len(spans)
                    receiver.bodies += 1
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(self, found: Callable[[list[Span]], bool], timeout_s: float = 10.0) -> list[Span]:
        """The spans once ``found(spans)`` holds (the exporter batches); the last seen at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = list(self.spans)
            if found(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
