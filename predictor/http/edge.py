"""One table from histoserve errors to HTTP and gRPC, applied at the server edge.

Errors carry no status (see :mod:`predictor.errors`); this module alone
decides what a client sees: a JSON ``{"error": ...}`` body with the HTTP
status, or a gRPC status code, plus ``Retry-After`` for overload. The table is
matched by type: the first class of the error's MRO that has a row wins, so
the most specific class decides, whatever the order of the rows. Every
status histoserve answers comes from it, including the 413 of an oversized
body (:class:`~predictor.errors.PayloadTooLarge`, raised by the body-limit
middleware) and the 400 of a malformed body (FastAPI's 422, turned into an
:class:`~predictor.errors.InvalidInput`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from predictor.errors import (
    HistoserveError,
    InvalidInput,
    LoadRefused,
    NonFiniteOutput,
    Overloaded,
    PayloadTooLarge,
    QueueTimeout,
    StartupError,
    Unavailable,
)
from predictor.kserve.compat import ExceptionToStatusInterceptor

logger = logging.getLogger("histoserve")


@dataclass(frozen=True)
class Status:
    """What the client sees for one kind of error."""

    http: HTTPStatus
    grpc: grpc.StatusCode


ERROR_TABLE: Mapping[type[BaseException], Status] = {
    InvalidInput: Status(HTTPStatus.BAD_REQUEST, grpc.StatusCode.INVALID_ARGUMENT),
    NonFiniteOutput: Status(HTTPStatus.UNPROCESSABLE_ENTITY, grpc.StatusCode.FAILED_PRECONDITION),
    PayloadTooLarge: Status(
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE, grpc.StatusCode.RESOURCE_EXHAUSTED
    ),
    Unavailable: Status(HTTPStatus.SERVICE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    # Triton answers a request whose timeout passed in its queue with UNAVAILABLE too
    QueueTimeout: Status(HTTPStatus.SERVICE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    LoadRefused: Status(HTTPStatus.CONFLICT, grpc.StatusCode.FAILED_PRECONDITION),
    StartupError: Status(HTTPStatus.SERVICE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    HistoserveError: Status(HTTPStatus.INTERNAL_SERVER_ERROR, grpc.StatusCode.INTERNAL),
}
"""Error class to status; :func:`status_for` picks the most specific class's row."""


def status_for(exc: BaseException) -> Status | None:
    """The row of the most specific class of ``exc`` in the table, or ``None``.

    ``None`` means ``exc`` is not a histoserve error (KServe handles it).
    """
    for cls in type(exc).__mro__:
        status = ERROR_TABLE.get(cls)
        if status is not None:
            return status
    return None


def retry_after_header(exc: BaseException) -> dict[str, str]:
    """``Retry-After`` (whole seconds, at least 1) for overload errors."""
    if isinstance(exc, Overloaded):
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    return {}


class RefusalLog:
    """Logs overload refusals at most once per ``interval_s``, with the count left out.

    A client that ignores ``Retry-After`` and resends at once is refused
    hundreds of times a second (``docs/reliability.md``): a warning line for
    each was a twentieth of the event loop's work per refusal and a log flood
    of its own. The first refusal is logged at once; the next line comes no
    sooner than ``interval_s`` later and says how many were refused since
    (the count of every refusal is also in the metrics).

    Args:
        interval_s: Least time between two lines.
        clock: Monotonic seconds (a test's own clock).
    """

    def __init__(self, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._next_s = -math.inf
        self._unlogged = 0

    def refused(self, http: int, exc: BaseException) -> None:
        """Counts one refusal; logs it (with those unlogged before it) when its time has come."""
        now = self._clock()
        with self._lock:
            if now < self._next_s:
                self._unlogged += 1
                return
            unlogged, self._unlogged = self._unlogged, 0
            self._next_s = now + self._interval_s
        more = f" ({unlogged} more refused since the last line)" if unlogged else ""
        logger.warning("request refused (%d): %s%s", http, exc, more)


_refusals = RefusalLog()


def error_response(exc: HistoserveError) -> JSONResponse:
    """The HTTP answer to ``exc``: its table status, ``{"error": message}``, headers."""
    status = status_for(exc)
    assert status is not None  # every HistoserveError has a row (the root's)
    if isinstance(exc, Overloaded):
        _refusals.refused(status.http, exc)
    elif status.http >= 500:
        logger.warning("request failed (%d): %s", status.http, exc)
    return JSONResponse(
        status_code=status.http, content={"error": str(exc)}, headers=retry_after_header(exc)
    )


async def _histoserve_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HistoserveError)  # registered for HistoserveError only
    return error_response(exc)


async def _validation_handler(_: Request, exc: Exception) -> JSONResponse:
    errors: Any = exc.errors() if isinstance(exc, RequestValidationError) else str(exc)
    return error_response(InvalidInput(f"malformed request body: {_summarise(errors)}"))


def _summarise(errors: Any) -> str:
    if not isinstance(errors, list):
        return str(errors)
    parts = []
    for err in errors[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def install_http_handlers(app: FastAPI) -> None:
    """Registers the table's handler, and FastAPI's 422 as an ``InvalidInput``, on ``app``."""
    app.add_exception_handler(HistoserveError, _histoserve_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)


class GrpcErrorInterceptor(ExceptionToStatusInterceptor):
    """KServe's gRPC interceptor, taught the histoserve table first."""

    async def handle_exception(
        self, ex: Exception, request_or_iterator: Any, context: Any, method_name: str
    ) -> None:
        status = status_for(ex)
        if status is None:
            await super().handle_exception(ex, request_or_iterator, context, method_name)
            return
        if isinstance(ex, Overloaded):
            context.set_trailing_metadata((("retry-after", retry_after_header(ex)["Retry-After"]),))
        await context.abort(status.grpc, str(ex))
