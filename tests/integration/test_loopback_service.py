"""The Service stand-in (harness/service.py): endpoints that follow readiness, the activator's hold.

A plain TCP echo listener is the endpoint; what is checked is the proxy's
contract the autoscaling loop relies on: a connection that finds no endpoint
waits (counted in ``waiting``) until one is added and is then served; a
removed endpoint gets no new connection, so with none left a connection is
closed at once.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from harness.service import LoopbackService
from harness.waiting import wait_until


@pytest.fixture
def echo() -> Iterator[int]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


def _ask(port: int, answers: list[bytes]) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(b"ping")
            answers.append(sock.recv(1024))
        except ConnectionResetError:
            answers.append(b"")  # closed with our bytes unread: a reset


def test_a_connection_waits_for_the_first_endpoint(echo: int) -> None:
    service = LoopbackService([], hold_s=30)
    answers: list[bytes] = []
    client = threading.Thread(target=_ask, args=(service.port, answers))
    client.start()
    wait_until(lambda: service.waiting == 1, "the connection to be held")
    service.add(echo)
    client.join(30)
    assert answers == [b"ping"] and service.waiting == 0
    service.close()


def test_a_removed_endpoint_gets_no_new_connection(echo: int) -> None:
    service = LoopbackService([echo])
    answers: list[bytes] = []
    _ask(service.port, answers)
    service.remove(echo)
    _ask(service.port, answers)
    assert answers == [b"ping", b""], answers  # closed at once: no endpoint, no hold
    assert service.connections == {echo: 1}
    service.close()
