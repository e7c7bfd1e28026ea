"""``HistoModelServer``: KServe's ModelServer with histoserve's edge and lifecycle.

What it changes, and why (``docs/architecture.md``, "Layers"; what it takes from KServe
privately is in :mod:`predictor.kserve.compat`):

- errors map through one table (:mod:`predictor.http.edge`), 413 and the
  malformed-body 400 (FastAPI's 422) included;
- binary V2 bodies keep ``BYTES`` as bytes (:mod:`predictor.kserve.dataplane`);
- request bodies are bounded (HTTP ``max_body_bytes``, gRPC message size);
- batchers start inside the serving loop;
- SIGTERM drains: readiness false at once, new requests refused with 503,
  admitted requests finish (or 503 at the drain deadline), then the servers
  stop and the process exits 0. Stock KServe unloads models at once.
- ``GET /v2/models/{name}/config`` returns the full spec, provenance and the
  effective batching configuration;
- the model repository extension (``POST /v2/repository/index``,
  ``/v2/repository/models/{name}/load|unload``, gRPC's ``RepositoryIndex``,
  ``RepositoryModelLoad``/``Unload``) is :mod:`predictor.repository`'s;
- ``POST /v2/models/{name}/infer`` is answered by
  :class:`~predictor.kserve.fast_infer.FastInferMiddleware` in front of
  FastAPI's router (``--rest_fast_path``), same bytes on the wire.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.middleware import Middleware
from timing_asgi import TimingMiddleware

from predictor import tracing
from predictor.codecs.v2 import parse_binary_body
from predictor.errors import ConfigError, InvalidInput, PayloadTooLarge
from predictor.http.edge import error_response, install_http_handlers
from predictor.http.grpc_server import GrpcServer
from predictor.http.json_logs import RequestLogContext
from predictor.http.traced import TracingMiddleware
from predictor.kserve.compat import (
    FASTAPI_APP_IMPORT_STRING,
    ModelNotFound,
    ModelServer,
    RESTServer,
    fastapi_app,
    register_models,
    request_exit,
    serve_on_socket,
    serve_without_signal_capture,
    set_listen_host,
)
from predictor.kserve.dataplane import HistoDataPlane
from predictor.kserve.fast_infer import FastInferMiddleware
from predictor.kserve.registry import StatefulRegistry
from predictor.repository.repository import FixedModels

logger = logging.getLogger("histoserve")

GRPC_STOP_GRACE_S = 2.0
"""Grace for gRPC calls still open after the drain: answers being sent, nothing admitted."""


class _BodyTooLarge(Exception):
    """Raised from the bounded ``receive`` when a streamed body passes the limit."""


class BodyLimitMiddleware:
    """Refuses HTTP bodies over ``max_body_bytes`` with 413, before they are buffered whole.

    A declared ``Content-Length`` over the limit is refused before reading.
    A streamed (chunked) body is counted as it arrives; once over the limit,
    whatever the app would answer (FastAPI turns a failing ``receive`` into its
    own 400 ``{"detail": ...}``) is replaced by the same 413.
    """

    def __init__(self, app: Any, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _too_large(self, what: str) -> JSONResponse:
        limit = self.max_body_bytes
        return error_response(PayloadTooLarge(f"{what} exceeds the limit of {limit} bytes"))

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await self._too_large(f"request body of {int(length)} bytes")(scope, receive, send)
            return
        seen = 0
        exceeded = False

        async def bounded_receive() -> dict:
            nonlocal seen, exceeded
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                exceeded = True
                raise _BodyTooLarge()
            return message

        async def guarded_send(message: dict) -> None:
            if not exceeded:  # once over the limit, the 413 below is the only answer
                await send(message)

        try:
            await self.app(scope, bounded_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded:
            await self._too_large("streamed request body")(scope, receive, send)


class CloseWhileDrainingMiddleware:
    """Answers ``Connection: close`` once the server is draining.

    A keep-alive connection left idle until the server exits is closed under
    the client's next request, which then fails without an answer. Closing
    each connection after its answer during the drain sends clients to a new
    connection, which the closed listener then refuses cleanly.
    """

    def __init__(self, app: Any, draining: Any):
        self.app = app
        self.draining = draining

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_read = False

        async def tracking_receive() -> dict:
            nonlocal body_read
            message = await receive()
            body_read = body_read or not message.get("more_body", False)
            return message

        async def closing_send(message: dict) -> None:
            if message["type"] == "http.response.start" and self.draining():
                # A refusal sent before the body was read (KServe's V1 route checks
                # readiness first) would close the connection with the body unread:
                # the kernel then resets it and the client loses this very answer.
                while not body_read:
                    await tracking_receive()
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, tracking_receive, closing_send)


class _RESTServer(RESTServer):
    """KServe's REST server that hands the app to ``finish_app`` once KServe has built it.

    KServe adds its own middlewares (``timing_asgi``, the optional access
    logger) when it builds the app, after anything added before: histoserve
    places its middlewares relative to them, so it must run after.
    """

    def __init__(self, *args: Any, finish_app: Callable[[FastAPI], None], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._finish_app = finish_app

    def create_application(self) -> None:
        super().create_application()
        self._finish_app(fastapi_app())


class HistoModelServer(ModelServer):
    """ModelServer with drain-on-SIGTERM, bounded bodies and histoserve's error table.

    Args:
        drain_timeout_s: Longest wait for admitted requests after SIGTERM.
        max_body_bytes: Largest HTTP body accepted.
        grpc_max_receive_bytes: Largest gRPC message received;
            ``max_body_bytes`` when ``None`` (not gRPC's 4 MiB default).
        grpc_max_send_bytes: Largest gRPC message sent (an answer over it
            fails ``RESOURCE_EXHAUSTED``); ``max_body_bytes`` when ``None``.
        rest_fast_path: Answer ``POST /v2/models/{name}/infer`` in
            :class:`~predictor.kserve.fast_infer.FastInferMiddleware` instead
            of FastAPI's route (same answers, less CPU per request).
        bind_address: The address HTTP and gRPC listen on; ``None``: every
            interface (``0.0.0.0`` for HTTP, ``[::]`` for gRPC, as KServe).
        http_socket: The HTTP listening socket, already bound
            (:mod:`predictor.http.listeners`); ``None``: uvicorn binds it.
        grpc_reuse_port: Bind gRPC with ``SO_REUSEPORT`` (front ends of one
            pod only; see :class:`~predictor.http.grpc_server.GrpcServer`).
        json_logs: ``--log_format json``: each request's log lines name it
            (:class:`~predictor.http.json_logs.RequestLogContext`).
        **kwargs: KServe ``ModelServer`` arguments (ports, ``workers``: its server processes, ...).
    """

    def __init__(
        self,
        *,
        drain_timeout_s: float = 30.0,
        max_body_bytes: int = 256 << 20,
        grpc_max_receive_bytes: int | None = None,
        grpc_max_send_bytes: int | None = None,
        rest_fast_path: bool = True,
        bind_address: str | None = None,
        http_socket: socket.socket | None = None,
        grpc_reuse_port: bool = False,
        json_logs: bool = False,
        **kwargs: Any,
    ):
        super().__init__(registered_models=StatefulRegistry(), **kwargs)
        self._http_socket = http_socket
        self._grpc_reuse_port = grpc_reuse_port
        if self.workers != 1:
            raise ConfigError(
                f"--workers must be 1 (one batcher owns the device), got {self.workers}"
            )
        if drain_timeout_s < 0:
            raise ConfigError(f"drain_timeout_s must be >= 0, got {drain_timeout_s}")
        self.dataplane = HistoDataPlane(
            model_registry=self.registered_models, parse_body=parse_binary_body
        )
        self._drain_timeout_s = drain_timeout_s
        self._max_body_bytes = max_body_bytes
        self._grpc_max_receive_bytes = grpc_max_receive_bytes or max_body_bytes
        self._grpc_max_send_bytes = grpc_max_send_bytes or max_body_bytes
        self._rest_fast_path = bool(rest_fast_path)
        self._json_logs = json_logs
        self._bind_address = bind_address
        self._stopping = False

    def start(self, models: list[Any], repository: Any = None) -> None:
        """Registers ``models`` and serves until SIGTERM/SIGINT and the drain complete.

        ``repository`` answers the model repository extension
        (:class:`~predictor.repository.repository.Repository`); None: ``models``
        are fixed (:class:`~predictor.repository.repository.FixedModels`).
        """
        repository = repository or FixedModels(models)
        registry: StatefulRegistry = self.registered_models
        registry.not_served = repository.refusal
        if hasattr(repository, "attach"):
            repository.attach(registry.update, registry.withdraw)
        self.model_repository_extension = repository
        if models or not hasattr(repository, "attach"):
            register_models(self, models)
        self._http = _RESTServer(
            FASTAPI_APP_IMPORT_STRING,
            self.dataplane,
            self.model_repository_extension,
            self.http_port,
            access_log_format=self.access_log_format,
            workers=1,
            grace_period=self.grace_period,
            event_loop=self.event_loop,
            timeout_keep_alive=self.timeout_keep_alive,
            ssl_certfile=self.ssl_certfile,
            ssl_keyfile=self.ssl_keyfile,
            finish_app=self._configure_app,
        )
        if self._bind_address is not None:
            set_listen_host(self._http, self._bind_address)
        # We own SIGTERM (drain first); uvicorn must not exit on it by itself.
        serve_without_signal_capture(self._http)
        self._grpc = (
            GrpcServer(
                self.grpc_port,
                self.dataplane,
                repository,
                float(self.grace_period),
                max_receive_bytes=self._grpc_max_receive_bytes,
                max_send_bytes=self._grpc_max_send_bytes,
                host=self._bind_address,
                reuse_port=self._grpc_reuse_port,
            )
            if self.enable_grpc
            else None
        )
        self.setup_event_loop()
        asyncio.run(self._serve_until_stopped())

    def _configure_app(self, app: FastAPI) -> None:
        """Histoserve's handlers, middlewares and config route on KServe's built app."""
        install_http_handlers(app)
        self._place_middlewares(app)
        app.add_api_route("/v2/models/{model_name}/config", self._model_config, methods=["GET"])
        self._repository_routes(app)

    def _repository_routes(self, app: FastAPI) -> None:
        """The repository extension's routes, ahead of KServe's load/unload.

        A name is matched whole (slashes included) so that a bad one is the
        repository's 400 naming it, not a bare 404; a load asking Triton's
        configuration or file override is a 400 (histoserve loads the folder
        as it is).
        """
        repository = self.model_repository_extension

        async def index(request: Request) -> list[dict[str, Any]]:
            body = await request.body()
            ready = False
            if body.strip():
                try:
                    ready = bool(json.loads(body).get("ready", False))
                except (ValueError, AttributeError) as exc:
                    raise InvalidInput("repository index: body must be a JSON object") from exc
            return await repository.index(ready)

        async def load(model_name: str, request: Request) -> dict[str, Any]:
            body = await request.body()
            try:
                parameters = (json.loads(body) if body.strip() else {}).get("parameters") or {}
            except (ValueError, AttributeError) as exc:
                raise InvalidInput("load: body must be a JSON object") from exc
            extra = sorted(k for k in parameters if k == "config" or k.startswith("file:"))
            if extra:
                raise InvalidInput(
                    f"load of {model_name!r}: parameter {extra[0]!r} is not supported (a model "
                    "loads from its folder as it is)",
                    input_name="parameters",
                )
            await repository.load(model_name)
            return {"name": model_name, "load": True}

        async def unload(model_name: str) -> dict[str, Any]:
            await repository.unload(model_name)
            return {"name": model_name, "unload": True}

        before = len(app.router.routes)
        app.add_api_route("/v2/repository/index", index, methods=["POST"])
        app.add_api_route("/v2/repository/models/{model_name:path}/load", load, methods=["POST"])
        app.add_api_route(
            "/v2/repository/models/{model_name:path}/unload", unload, methods=["POST"]
        )
        ours = app.router.routes[before:]
        del app.router.routes[before:]
        app.router.routes[0:0] = ours

    def _place_middlewares(self, app: FastAPI) -> None:
        """Inserts ours among KServe's (``user_middleware[0]`` is the outermost).

        Outermost first: the request's span (only when tracing is on,
        :mod:`predictor.http.traced`), drain's ``Connection: close``, the body limit, then
        the fast infer route, so 413 and the drain's close apply to it too.
        With the fast path on, ours sit outside KServe's ``timing_asgi``, which
        it exists to skip, unless ``--enable_latency_logging`` asks for the
        timing lines: then the fast path sits inside it, and ours too (as
        with the fast path off, the order KServe's app always had). An access
        logger (``--access_log_format``) stays outside everything.
        """
        ours = [
            Middleware(CloseWhileDrainingMiddleware, draining=lambda: self._stopping),
            Middleware(BodyLimitMiddleware, max_body_bytes=self._max_body_bytes),
        ]
        if tracing.enabled():  # off: not installed at all
            ours.insert(0, Middleware(TracingMiddleware))
        if self._rest_fast_path:
            ours.append(Middleware(FastInferMiddleware, dataplane=self.dataplane))
        if self._json_logs:  # outermost: every line a request's task writes names it
            ours.insert(0, Middleware(RequestLogContext))
        outside = self._rest_fast_path and not self.enable_latency_logging
        insert_beside_timing(app.user_middleware, ours, outside=outside)
        logger.info(
            "REST fast path %s (POST /v2/models/{name}/infer %s)",
            "on" if self._rest_fast_path else "off",
            "answered before FastAPI's router" if self._rest_fast_path else "through FastAPI",
        )

    async def _model_config(self, model_name: str) -> dict[str, Any]:
        model = self.registered_models.get_model(model_name)
        if model is None:
            raise ModelNotFound(model_name)
        return model.get_metadata()

    async def _serve_until_stopped(self) -> None:
        for model in self.registered_models.get_models().values():
            if hasattr(model, "start_batching"):
                await model.start_batching()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda s=sig: asyncio.ensure_future(self.shutdown(s)))
        servers = [self._start_rest()]
        if self._grpc is not None:
            self._grpc.bind(self.max_threads)  # a taken port: StartupError, before serving
            servers.append(self._grpc.serve())
        self._listening()
        await asyncio.gather(*servers)

    def _listening(self) -> None:
        """Called once every port is bound, just before serving (a hook; nothing here)."""

    def _start_rest(self) -> Any:
        """The REST server's serving coroutine: on ``http_socket`` when given (bound already)."""
        if self._http_socket is not None:
            return serve_on_socket(self._http, self._http_socket)
        return self._http.start()

    async def shutdown(self, sig: int | None = None) -> None:
        """Drains every model, then stops HTTP and gRPC; safe to call twice."""
        if self._stopping:
            return
        self._stopping = True
        logger.info("signal %s: draining (deadline %.1fs)", sig, self._drain_timeout_s)
        models = list(self.registered_models.get_models().values())
        drained = await asyncio.gather(
            *(m.drain(self._drain_timeout_s) for m in models if hasattr(m, "drain"))
        )
        logger.info("drain %s; stopping servers", "complete" if all(drained) else "deadline passed")
        request_exit(self._http)
        if self._grpc is not None:
            # After a complete drain every admitted call has its answer: calls still
            # open were never dispatched (seen: one still uploading), and waiting the
            # full grace for them only delayed the exit. Past the drain deadline, a
            # call of the batch still running gets UNAVAILABLE, as the contract says.
            await self._grpc.stop(GRPC_STOP_GRACE_S)
        for model in models:
            model.stop()


def insert_beside_timing(stack: list[Middleware], ours: list[Middleware], *, outside: bool) -> None:
    """Puts ``ours`` (outermost first) just outside or just inside KServe's timing middleware.

    ``stack`` is Starlette's ``user_middleware`` (index 0 the outermost);
    without a timing middleware in it, ``ours`` go innermost.
    """
    timing = next((i for i, m in enumerate(stack) if m.cls is TimingMiddleware), len(stack))
    at = timing if outside or timing == len(stack) else timing + 1
    stack[at:at] = ours
