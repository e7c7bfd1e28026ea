"""``--bind_address`` end to end: every listener of a real server binds where it is told.

Read from the kernel's socket table (:mod:`harness.listeners`), so every
socket of a port counts: each front end's shared HTTP socket and its gRPC
server's, not only the one a client reaches. Unset (the image, the chart),
the server listens on every interface.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.listeners import is_loopback, listening_addresses
from harness.server import Server, start_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def loopback_frontends(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """Two front ends before one device owner, told to bind 127.0.0.1."""
    server = start_server(
        embedding_package_dir,
        tmp_path_factory.mktemp("bind"),
        "--bind_address",
        "127.0.0.1",
        "--frontends",
        "2",
    )
    yield server
    server.stop()


def test_every_front_end_listens_on_loopback_only(loopback_frontends: Server) -> None:
    server = loopback_frontends
    assert httpx.get(f"{server.base}/v2/models/{server.model_name}/ready").status_code == 200
    http, grpc = listening_addresses(server.http_port), listening_addresses(server.grpc_port)
    assert http == ["127.0.0.1"], http  # one socket, bound once, every front end accepts on it
    assert grpc and all(map(is_loopback, grpc)), grpc


def test_unset_listens_on_every_interface(embedding_server: Server) -> None:
    """What the image and the chart rely on: pods are reached on their pod IP."""
    assert listening_addresses(embedding_server.http_port) == ["0.0.0.0"]
    assert listening_addresses(embedding_server.grpc_port) == ["::"]
