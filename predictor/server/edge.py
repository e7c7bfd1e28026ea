"""One table from histoserve errors to HTTP and gRPC, applied at the server edge.

Errors carry no status (see :mod:`predictor.errors`); this module alone
decides what a client sees: a JSON ``{"error": ...}`` body with the HTTP
status, or a gRPC status code, plus ``Retry-After`` for overload. It also
turns FastAPI's 422 for malformed bodies into the contract's 400.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor

from predictor.errors import (
    HistoserveError,
    InvalidInput,
    ModelNotReady,
    Overloaded,
    StartupError,
    Unavailable,
)

logger = logging.getLogger("histoserve")


@dataclass(frozen=True)
class Status:
    """What the client sees for one kind of error."""

    http: HTTPStatus
    grpc: grpc.StatusCode


# Most specific first: the first matching row wins.
ERROR_TABLE: tuple[tuple[type[BaseException], Status], ...] = (
    (InvalidInput, Status(HTTPStatus.BAD_REQUEST, grpc.StatusCode.INVALID_ARGUMENT)),
    (Overloaded, Status(HTTPStatus.SERVICE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE)),
    (ModelNotReady, Status(HTTPStatus.SERVICE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE)),
    (Unavailable, Status(HTTPStatus.SERVICE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE)),
    (StartupError, Status(HTTPStatus.SERVICE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE)),
    (HistoserveError, Status(HTTPStatus.INTERNAL_SERVER_ERROR, grpc.StatusCode.INTERNAL)),
)


def status_for(exc: BaseException) -> Status | None:
    """The table row for ``exc``, or ``None`` when it is not a histoserve error."""
    for cls, status in ERROR_TABLE:
        if isinstance(exc, cls):
            return status
    return None


def retry_after_header(exc: BaseException) -> dict[str, str]:
    """``Retry-After`` (whole seconds, at least 1) for overload errors."""
    if isinstance(exc, Overloaded):
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    return {}


async def _histoserve_handler(_: Request, exc: Exception) -> JSONResponse:
    status = status_for(exc)
    assert status is not None  # registered for HistoserveError only
    if status.http >= 500:
        logger.warning("request failed (%d): %s", status.http, exc)
    return JSONResponse(
        status_code=status.http, content={"error": str(exc)}, headers=retry_after_header(exc)
    )


async def _validation_handler(_: Request, exc: Exception) -> JSONResponse:
    errors: Any = exc.errors() if isinstance(exc, RequestValidationError) else str(exc)
    return JSONResponse(
        status_code=HTTPStatus.BAD_REQUEST,
        content={"error": f"malformed request body: {_summarise(errors)}"},
    )


def _summarise(errors: Any) -> str:
    if not isinstance(errors, list):
        return str(errors)
    parts = []
    for err in errors[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def install_http_handlers(app: FastAPI) -> None:
    """Registers the table's handlers and the 422 -> 400 override on ``app``."""
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
