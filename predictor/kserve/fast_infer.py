"""``POST /v2/models/{name}/infer`` answered in a raw ASGI layer, in front of FastAPI.

Every V2 REST client calls this one route. Through FastAPI it pays for the
router (route matching about six times per request), dependency solving,
``Request``/``Response`` objects, Starlette's exception middleware and
KServe's ``timing_asgi`` middleware: together about half of the event loop's
CPU per single-tile request (``docs/performance.md``, "The request path (null model)"). This middleware
recognises the route from the path alone and does what KServe's
``V2Endpoints.infer`` does, with the same dataplane calls in the same order
(model ready check, ``decode``, ``infer``, ``encode``), so answers are the
same bytes, status and headers as FastAPI's.

What it does not answer itself goes to FastAPI untouched: every other route
(the versioned infer path included) and every request whose body FastAPI
would refuse before the endpoint runs (an empty body, JSON that does not
parse or does not validate as an ``InferenceRequest``, a client that went
away mid-body). Those get FastAPI's own answer: the body read so far is
replayed to it message by message. Errors raised by the endpoint's work go
through the app's exception handlers, the same ones FastAPI's exception
middleware would pick (histoserve's go through
:func:`predictor.http.edge.error_response`); an exception no handler takes
propagates to Starlette's server-error middleware, as it does today.
"""

from __future__ import annotations

import email.message
import inspect
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from predictor.kserve.compat import (
    REST_V2,
    V2_INFER_ROUTE,
    DataPlane,
    InferenceRequest,
    InferenceResponse,
    KServeModelNotReady,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_PREFIX, _SUFFIX = V2_INFER_ROUTE.split("{model_name}")  # "/v2/models/", "/infer"
_CONTENT_TYPE_CACHE_SIZE = 64


class FastInferMiddleware:
    """Answers the unversioned V2 REST infer route; passes everything else to ``app``.

    Args:
        app: The next ASGI app (KServe's middlewares and FastAPI's router).
        dataplane: The server's dataplane (the one FastAPI's route calls).
    """

    def __init__(self, app: Any, dataplane: DataPlane):
        if dataplane is None:
            raise ValueError("dataplane must be the server's DataPlane, got None")
        self.app = app
        self.dataplane = dataplane
        self._json_types: dict[bytes, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        model_name = infer_route_model(scope)
        if model_name is None:
            await self.app(scope, receive, send)
            return
        received, disconnected = await _read_body(receive)
        body = _join(received)
        parsed = None if disconnected or not body else self._parse(body, scope)
        if parsed is None:  # FastAPI refuses it before the endpoint: let it answer
            await self.app(scope, _replay(received, receive), send)
            return
        try:
            await self._infer(scope, send, model_name, parsed)
        except Exception as exc:
            handler = _exception_handler(scope, exc)
            if handler is None:
                raise  # Starlette's server-error middleware answers it, as for FastAPI's route
            await _answer_error(handler, scope, receive, send, exc)

    def _parse(self, body: bytes, scope: Scope) -> InferenceRequest | bytes | None:
        """The endpoint's ``request_body`` as FastAPI would give it, or ``None`` if it refuses.

        FastAPI parses JSON only for an ``application/json`` or ``+json``
        content type (none at all means raw bytes), then validates against
        ``Union[InferenceRequest, bytes]``: a dict can only be an
        ``InferenceRequest``, bytes stay bytes.
        """
        if not self._is_json(_first_header(scope, b"content-type")):
            return body
        try:
            # orjson (2-3x faster than the json module on a base64 tile) accepts
            # no more than json does: what it refuses (bad JSON, but also NaN,
            # huge integers, UTF-16) goes to FastAPI, whose json.loads decides.
            return InferenceRequest.model_validate(orjson.loads(body))
        except Exception:  # bad JSON, bad UTF-8, too deep, invalid: FastAPI's own answer
            return None

    def _is_json(self, content_type: bytes | None) -> bool:
        if not content_type:
            return False
        known = self._json_types.get(content_type)
        if known is None:
            known = _json_content_type(content_type.decode("latin-1"))
            if len(self._json_types) < _CONTENT_TYPE_CACHE_SIZE:
                self._json_types[content_type] = known
        return known

    async def _infer(
        self, scope: Scope, send: Send, model_name: str, body: InferenceRequest | bytes
    ) -> None:
        """KServe's ``V2Endpoints.infer``, step for step, then the response FastAPI would send."""
        dataplane = self.dataplane
        if not await dataplane.model_ready(model_name, True):
            raise KServeModelNotReady(model_name)  # as KServe's own route raises it
        headers = request_headers(scope)
        infer_request, _ = dataplane.decode(
            body, headers, protocol_version=REST_V2, model_name=model_name
        )
        response, response_headers = await dataplane.infer(
            model_name=model_name, request=infer_request, headers=headers
        )
        response, res_headers = dataplane.encode(
            model_name=model_name, response=response, headers=headers, req_attributes={}
        )
        response_headers.update(res_headers)
        response_headers.pop("content-length", None)
        response_headers.pop("content-type", None)
        extra = _raw_headers(response_headers)
        if isinstance(response, bytes):
            # FastAPI returns its sub-response as is: status 200, only these
            # headers (no content type or length: uvicorn sends it chunked).
            await send({"type": "http.response.start", "status": 200, "headers": extra})
            await send({"type": "http.response.body", "body": response})
            return
        payload = _render_json(InferenceResponse.model_validate(response))
        start = [
            (b"content-length", str(len(payload)).encode("latin-1")),
            (b"content-type", b"application/json"),
            *extra,
        ]
        await send({"type": "http.response.start", "status": 200, "headers": start})
        await send({"type": "http.response.body", "body": payload})


def _render_json(model: BaseModel) -> bytes:
    """What FastAPI sends for a returned model, without ``jsonable_encoder``'s walk.

    FastAPI's ``jsonable_encoder`` is ``model_dump(mode="json", by_alias=True)``
    followed by a Python walk over every value of the result, which changes
    nothing in a JSON-mode dump but visits each float: 1.2 ms for one
    1536-float embedding here, most of what made a V2 JSON tile dearer than
    the same tile over V1 (whose route hands its dict to ``ORJSONResponse``
    unwalked). The dump alone, rendered as the app's ``default_response_class``
    renders (KServe's ``ORJSONResponse``, without the class's per-instance
    deprecation warning), gives the same bytes.
    """
    return orjson.dumps(
        model.model_dump(mode="json", by_alias=True),
        option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY,
    )


def infer_route_model(scope: Scope) -> str | None:
    """The model name when ``scope`` is ``POST /v2/models/{name}/infer``, else ``None``.

    ``{name}`` is one non-empty path segment, as FastAPI's ``str`` path
    parameter matches it (``scope["path"]`` is already percent-decoded). A
    ``root_path`` (the app mounted under a prefix) is left to FastAPI.
    """
    if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("root_path"):
        return None
    path: str = scope["path"]
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    name = path[len(_PREFIX) : -len(_SUFFIX)]
    if not name or "/" in name:
        return None
    return name


def request_headers(scope: Scope) -> dict[str, str]:
    """``dict(request.headers)`` as Starlette builds it: latin-1, the first of repeated names."""
    headers: dict[str, str] = {}
    for key, value in scope["headers"]:
        name = key.decode("latin-1")
        if name not in headers:
            headers[name] = value.decode("latin-1")
    return headers


def _first_header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def _json_content_type(value: str) -> bool:
    """FastAPI's test: ``application/json`` or ``application/*+json``, parsed by ``email``."""
    message = email.message.Message()
    message["content-type"] = value
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def _raw_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """Starlette's ``MutableHeaders.update`` on an empty list: lower-cased names, last value wins."""
    merged: dict[bytes, bytes] = {}
    for key, value in headers.items():
        merged[key.lower().encode("latin-1")] = value.encode("latin-1")
    return list(merged.items())


async def _read_body(receive: Receive) -> tuple[list[Message], bool]:
    """Every message of the request body, and whether the client went away first."""
    received: list[Message] = []
    while True:
        message = await receive()
        received.append(message)
        if message["type"] != "http.request":
            return received, True
        if not message.get("more_body", False):
            return received, False


def _join(received: list[Message]) -> bytes:
    if len(received) == 1:
        return received[0].get("body", b"")
    return b"".join(m.get("body", b"") for m in received if m["type"] == "http.request")


def _replay(received: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that hands out ``received`` again, then the real one's messages."""
    pending = list(received)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def _exception_handler(scope: Scope, exc: Exception) -> Callable[..., Any] | None:
    """The app's handler for ``exc``, found as Starlette's exception middleware finds it.

    The first class of the error's MRO with a handler wins (histoserve's errors
    map to :func:`predictor.http.edge.error_response` this way). ``Exception``
    itself belongs to the server-error middleware outside this layer: ``None``.
    """
    handlers = scope["app"].exception_handlers
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        handler = handlers.get(cls)
        if handler is not None:
            return handler
    return None


async def _answer_error(
    handler: Callable[..., Any], scope: Scope, receive: Receive, send: Send, exc: Exception
) -> None:
    request = Request(scope, receive)
    if inspect.iscoroutinefunction(handler):
        response = await handler(request, exc)
    else:
        response = await run_in_threadpool(handler, request, exc)
    await response(scope, receive, send)
