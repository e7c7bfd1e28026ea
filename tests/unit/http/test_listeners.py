"""Listening sockets bound once: a taken port refused, no sharing with a stranger, no Nagle wait."""

from __future__ import annotations

import asyncio
import socket

import pytest
from grpc import aio

from predictor.errors import StartupError
from predictor.http.listeners import bind_http, inherited, open_listeners, reserve_shared_port


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _accepted_nodelay(sock: socket.socket, port: int) -> int:
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[int] = loop.create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            peer = transport.get_extra_info("socket")
            accepted.set_result(peer.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    server = await loop.create_server(Probe, sock=sock)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        value = await asyncio.wait_for(accepted, 5)
        writer.close()
        return value
    finally:
        server.close()


def test_an_accepted_connection_has_tcp_nodelay() -> None:
    """Without it a response sent as head then body waits ~40 ms for the client's delayed ACK."""
    port = _free_port()
    assert asyncio.run(_accepted_nodelay(bind_http("127.0.0.1", port), port)) != 0


def test_the_http_socket_never_shares_its_port() -> None:
    port = _free_port()
    first = bind_http("127.0.0.1", port)
    try:
        assert first.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0
        with pytest.raises(StartupError, match=f"HTTP port 127.0.0.1:{port}: in use"):
            bind_http("127.0.0.1", port)
        stranger = socket.socket()
        stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with pytest.raises(OSError):
            stranger.bind(("127.0.0.1", port))
        stranger.close()
    finally:
        first.close()


def test_an_inherited_descriptor_is_the_same_listening_socket() -> None:
    port = _free_port()
    first = bind_http("127.0.0.1", port)
    copy = inherited(socket.dup(first.fileno()))  # as a child sees it after exec
    try:
        assert copy.getsockname() == ("127.0.0.1", port)
        assert copy.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    finally:
        copy.close()
        first.close()


async def _grpc_bind(address: str, reuse: int) -> int:
    server = aio.server(options=[("grpc.so_reuseport", reuse)])
    try:
        return server.add_insecure_port(address)
    finally:
        await server.stop(None)


@pytest.mark.parametrize(("host", "grpc_host"), [("127.0.0.1", "127.0.0.1"), (None, "[::]")])
def test_the_grpc_reservation_admits_front_ends_only(host: str | None, grpc_host: str) -> None:
    port = _free_port()
    reservation = reserve_shared_port(host, port)
    try:
        with pytest.raises(StartupError, match="in use"):  # a second pod's supervisor, first
            reserve_shared_port(host, port)
        with pytest.raises(StartupError, match="in use"):  # any plain server
            bind_http("127.0.0.1", port)
        with pytest.raises(RuntimeError):  # a one-process server: grpc.so_reuseport off
            asyncio.run(_grpc_bind(f"{grpc_host}:{port}", 0))
        assert asyncio.run(_grpc_bind(f"{grpc_host}:{port}", 1)) == port  # a front end
    finally:
        reservation.close()


def test_a_taken_grpc_port_stops_the_supervisor_and_frees_its_http_port() -> None:
    http, grpc = _free_port(), _free_port()
    taker = bind_http("127.0.0.1", grpc)
    try:
        with pytest.raises(StartupError, match=f"gRPC port 127.0.0.1:{grpc}: in use"):
            open_listeners("127.0.0.1", http, grpc, shared=True, grpc=True)
        bind_http("127.0.0.1", http).close()  # released again
    finally:
        taker.close()
