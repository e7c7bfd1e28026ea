"""The front ends' shared HTTP socket: connections it accepts must not wait on Nagle."""

from __future__ import annotations

import asyncio
import socket

from predictor.frontends.frontend import reuse_port_socket


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _accepted_nodelay(port: int) -> int:
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[int] = loop.create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    server = await loop.create_server(Probe, sock=reuse_port_socket(port))
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        value = await asyncio.wait_for(accepted, 5)
        writer.close()
        return value
    finally:
        server.close()


def test_an_accepted_connection_has_tcp_nodelay() -> None:
    """Without it a response sent as head then body waits ~40 ms for the client's delayed ACK."""
    assert asyncio.run(_accepted_nodelay(_free_port())) != 0


def test_two_sockets_share_the_port() -> None:
    port = _free_port()
    first, second = reuse_port_socket(port), reuse_port_socket(port)
    try:
        assert first.getsockname()[1] == second.getsockname()[1] == port
    finally:
        first.close()
        second.close()
