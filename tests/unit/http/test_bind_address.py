"""``--bind_address``: where the HTTP and gRPC listeners bind; unset, every interface.

``make serve`` passes ``127.0.0.1`` (a workstation's unauthenticated server
answers that machine only); the image and the chart pass nothing and keep
listening on every interface. The end-to-end checks (real servers, the kernel's
socket table) are ``tests/integration/test_bind_address.py`` and the ``make
serve`` test in ``tests/integration/test_docs_commands.py``.
"""

from __future__ import annotations

import socket

import pytest
from kserve import ModelRepository
from kserve.protocol.dataplane import DataPlane

from predictor.cli import build_parser, server_kwargs
from predictor.config import LimitsConfig
from predictor.http.grpc_server import listen_address
from predictor.http.listeners import bind_http
from predictor.kserve import compat as kserve_compat


def test_unset_is_every_interface_and_a_value_reaches_the_server() -> None:
    assert build_parser().parse_args([]).bind_address is None
    args = build_parser().parse_args(["--bind_address", "127.0.0.1"])
    assert server_kwargs(args, LimitsConfig())["bind_address"] == "127.0.0.1"


@pytest.mark.parametrize(
    ("host", "expected"),
    [(None, "[::]:8081"), ("127.0.0.1", "127.0.0.1:8081"), ("::1", "[::1]:8081")],
)
def test_grpc_listens_where_it_is_told(host: str | None, expected: str) -> None:
    assert listen_address(host, 8081) == expected


def test_the_rest_listener_takes_the_address() -> None:
    rest = kserve_compat.RESTServer(
        kserve_compat.FASTAPI_APP_IMPORT_STRING, DataPlane(ModelRepository()), None, 0
    )
    assert rest._server.config.host == "0.0.0.0"  # KServe's own, kept when the flag is unset
    kserve_compat.set_listen_host(rest, "127.0.0.1")
    assert rest._server.config.host == "127.0.0.1"  # the config uvicorn binds with


@pytest.mark.parametrize(("host", "bound"), [(None, "0.0.0.0"), ("127.0.0.1", "127.0.0.1")])
def test_the_http_socket_binds_the_address(host: str | None, bound: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sock = bind_http(host, port)
    try:
        assert sock.getsockname() == (bound, port)
    finally:
        sock.close()
