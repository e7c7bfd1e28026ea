"""The W3C ``traceparent`` a request carries, when the caller traces (standard library only).

``histoserve embed --otel-endpoint`` (:mod:`histoserve.embedding.tracing`)
sets it around each request it sends, in the sending thread; the transports
add it to that request's HTTP headers or gRPC metadata
(:func:`trace_headers`), so the server's spans of the request are children of
the client's. Untraced, nothing is added. The client core never imports
OpenTelemetry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_traceparent: ContextVar[str | None] = ContextVar("histoserve_traceparent", default=None)


def trace_headers() -> dict[str, str]:
    """``{"traceparent": ...}`` while a traced request is being sent, else ``{}``."""
    value = _traceparent.get()
    return {"traceparent": value} if value else {}


@contextlib.contextmanager
def carrying(traceparent: str) -> Iterator[None]:
    """Requests sent by this thread in the block carry ``traceparent``."""
    token = _traceparent.set(traceparent)
    try:
        yield
    finally:
        _traceparent.reset(token)
