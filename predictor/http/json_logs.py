"""``--log_format json``: one JSON object a line, for a log pipeline (Loki, Elasticsearch, Cloud Logging).

Every line of the process, KServe's, uvicorn's and ours alike, becomes one
object: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, the
served ``model`` and its ``package_sha256`` (once loaded), and for a line
written while an HTTP request is served, its ``request_id`` (the
``x-request-id`` header, as KServe's own trace line reads it, else one made
here) and ``trace_id`` (from a W3C ``traceparent`` header; absent without
one). A traceback goes in ``exception``, escaped, so it is still one line.

What is never written: pixels (no request body is logged anywhere), header
values other than those two (an ``Authorization`` or cookie never reaches a
log record), and the access log's query string (a token a client put in a
URL). A client's header values are bounded and checked before they are
written: a request id is at most 128 printable ASCII characters without
quotes or spaces, a trace id 32 hex digits, not all zero.

The request fields come from :class:`RequestLogContext`, an ASGI middleware
outside every other (the REST fast path included) that sets a context
variable for the request's task; the gRPC server's lines carry the model and
digest but no request fields. Off by default (``--log_format text``): then
nothing here runs.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

_MAX_REQUEST_ID = 128
_REQUEST_ID = re.compile(rf"[!#-&(-~]{{1,{_MAX_REQUEST_ID}}}")  # printable; no space or quote
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
_MODEL_PATH = re.compile(r"/v[12]/models/([^/:]+)")

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


@dataclass(frozen=True)
class RequestFields:
    """What a request adds to each line written while it is served."""

    request_id: str
    trace_id: str | None
    model: str | None


_REQUEST: ContextVar[RequestFields | None] = ContextVar("histoserve_log_request", default=None)
_PROCESS: dict[str, str] = {}


def set_served(model: str, package_sha256: str) -> None:
    """The model and package digest every later line names."""
    _PROCESS["model"] = model
    if package_sha256:
        _PROCESS["package_sha256"] = package_sha256


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` header value; None when absent or malformed."""
    if not traceparent:
        return None
    match = _TRACEPARENT.fullmatch(traceparent.strip().lower())
    if match is None or match.group(1) == "0" * 32:
        return None
    return match.group(1)


def request_fields(headers: dict[str, str], path: str) -> RequestFields:
    """A request's log fields from its headers (names lower case) and path."""
    given = headers.get("x-request-id", "")
    request_id = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
    model = _MODEL_PATH.match(path)
    return RequestFields(
        request_id, trace_id_of(headers.get("traceparent")), model.group(1) if model else None
    )


class RequestLogContext:
    """ASGI middleware: the request's :class:`RequestFields` for every line its task writes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        wanted = {b"x-request-id", b"traceparent"}
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope.get("headers", ())
            if k.lower() in wanted
        }
        token = _REQUEST.set(request_fields(headers, scope.get("path", "")))
        try:
            await self.app(scope, receive, send)
        finally:
            _REQUEST.reset(token)


class JsonFormatter(logging.Formatter):
    """A record as one JSON object (see the module docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": _message(record),
            **_PROCESS,
        }
        request = _REQUEST.get()
        if request is not None:
            out["request_id"] = request.request_id
            if request.trace_id:
                out["trace_id"] = request.trace_id
            if request.model:
                out["model"] = request.model
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def _message(record: logging.LogRecord) -> str:
    """The record's text; uvicorn's access line without the query string."""
    args = record.args
    if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
        client, method, path, version, status = args
        return f'{client} - "{method} {str(path).split("?", 1)[0]} HTTP/{version}" {status}'
    return record.getMessage()


def use_json_logs() -> None:
    """Every handler of every logger configured so far writes :class:`JsonFormatter` lines.

    Call after KServe configured logging (its server's constructor does) and
    again after anything that replaces handlers. Python's warnings go to the
    log too (``py.warnings``), so they are lines like the rest.
    """
    formatter = JsonFormatter()
    loggers = [logging.getLogger()] + [
        logger
        for logger in logging.root.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]
    for logger in loggers:
        for handler in logger.handlers:
            handler.setFormatter(formatter)
    logging.captureWarnings(True)
