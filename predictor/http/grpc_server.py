"""The V2 gRPC server: KServe's inference service with our error interceptor and limits,
and the describing calls KServe lacks (``ModelConfig``, ``RepositoryIndex``:
:mod:`predictor.http.grpc_config`)."""

from __future__ import annotations

from concurrent import futures
from typing import Any

from grpc import aio

from predictor import tracing
from predictor.errors import StartupError
from predictor.http.edge import GrpcErrorInterceptor
from predictor.http.grpc_config import describe_handler
from predictor.http.traced import GrpcTracingInterceptor
from predictor.kserve.registry import add_inference_services


def listen_address(host: str | None, port: int) -> str:
    """gRPC's ``host:port`` (an IPv6 literal in brackets); ``None``: every interface, ``[::]``."""
    if host is None:
        host = "::"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServer:
    """KServe's V2 gRPC service with our interceptor and message-size limits.

    ``host`` is the listen address (``None``: every interface). ``reuse_port``
    is for the front ends of one pod only: gRPC cannot serve an inherited
    listening socket, so each front end binds the port itself with
    ``SO_REUSEPORT`` beside the supervisor's exclusive reservation
    (:func:`predictor.http.listeners.reserve_shared_port`); everywhere else
    the port is bound exclusively (gRPC's own default would share it).
    """

    def __init__(
        self,
        port: int,
        dataplane: Any,
        repository: Any,
        grace_s: float,
        *,
        max_receive_bytes: int,
        max_send_bytes: int,
        host: str | None = None,
        reuse_port: bool = False,
    ):
        self._address = listen_address(host, port)
        self._dataplane = dataplane
        self._repository = repository
        self._grace_s = grace_s
        self.options = [
            ("grpc.max_send_message_length", max_send_bytes),
            ("grpc.max_receive_message_length", max_receive_bytes),
            ("grpc.so_reuseport", int(reuse_port)),
        ]
        """The channel options the server is created with (message-size limits)."""
        self._server: aio.Server | None = None

    def bind(self, max_workers: int) -> None:
        """Creates the server and binds its port (inside the running loop).

        Raises:
            StartupError: The port cannot be bound (in use, or no such address).
        """
        self._server = aio.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            interceptors=(
                GrpcErrorInterceptor(),
                *((GrpcTracingInterceptor(),) if tracing.enabled() else ()),
            ),
            options=self.options,
        )
        add_inference_services(self._server, self._dataplane, self._repository)
        self._server.add_generic_rpc_handlers((describe_handler(self._dataplane.model_registry),))
        try:
            self._server.add_insecure_port(self._address)
        except RuntimeError as exc:
            raise StartupError(f"gRPC cannot listen on {self._address}: in use?") from exc

    async def serve(self) -> None:
        """Serves until stopped (:meth:`bind` first)."""
        assert self._server is not None, "bind() first"
        await self._server.start()
        await self._server.wait_for_termination()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stops accepting calls; open ones get ``grace_s`` (default: the server's grace)."""
        if self._server is not None:
            await self._server.stop(grace=self._grace_s if grace_s is None else grace_s)
