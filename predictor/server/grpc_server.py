"""The V2 gRPC server: KServe's inference service with our error interceptor and limits."""

from __future__ import annotations

from concurrent import futures
from typing import Any

from grpc import aio

from predictor.kserve_compat import add_inference_service
from predictor.server.edge import GrpcErrorInterceptor


def listen_address(host: str | None, port: int) -> str:
    """gRPC's ``host:port`` (an IPv6 literal in brackets); ``None``: every interface, ``[::]``."""
    if host is None:
        host = "::"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServer:
    """KServe's V2 gRPC service with our interceptor and message-size limits.

    ``host`` is the listen address (``None``: every interface).
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
    ):
        self._address = listen_address(host, port)
        self._dataplane = dataplane
        self._repository = repository
        self._grace_s = grace_s
        self.options = [
            ("grpc.max_send_message_length", max_send_bytes),
            ("grpc.max_receive_message_length", max_receive_bytes),
        ]
        """The channel options the server is created with (message-size limits)."""
        self._server: aio.Server | None = None

    async def start(self, max_workers: int) -> None:
        self._server = aio.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            interceptors=(GrpcErrorInterceptor(),),
            options=self.options,
        )
        add_inference_service(self._server, self._dataplane, self._repository)
        self._server.add_insecure_port(self._address)
        await self._server.start()
        await self._server.wait_for_termination()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stops accepting calls; open ones get ``grace_s`` (default: the server's grace)."""
        if self._server is not None:
            await self._server.stop(grace=self._grace_s if grace_s is None else grace_s)
