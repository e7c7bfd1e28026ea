"""Both gRPC message limits are honoured on a live server: ``--grpc_max_send_message_length``
bounds answers, ``--grpc_max_receive_message_length`` bounds requests, each on its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.grpc_client import GrpcClient, GrpcError
from harness.server import Server, start_server
from harness.tiles import random_tiles

pytestmark = pytest.mark.integration
SEND_BYTES = 4096  # one 1536-float embedding (6 KiB) does not fit
RECEIVE_BYTES = 200_000  # one raw 224x224 tile (147 KiB) fits, two do not


@pytest.fixture(scope="module")
def server(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    srv = start_server(
        embedding_package_dir,
        tmp_path_factory.mktemp("grpc-limits"),
        "--grpc_max_send_message_length",
        str(SEND_BYTES),
        "--grpc_max_receive_message_length",
        str(RECEIVE_BYTES),
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[GrpcClient]:
    grpc = GrpcClient(server.grpc_url)
    yield grpc
    grpc.close()


def test_an_answer_over_the_send_limit_is_resource_exhausted(server: Server, client: GrpcClient):
    with pytest.raises(GrpcError) as err:  # the request (one tile) is under the receive limit
        client.infer(server.model_name, {"pixels": ("UINT8", random_tiles(1, seed=1))})
    assert "RESOURCE_EXHAUSTED" in err.value.status, err.value
    assert "sent message larger than max" in err.value.message.lower(), err.value


def test_a_request_over_the_receive_limit_is_resource_exhausted(server: Server, client: GrpcClient):
    with pytest.raises(GrpcError) as err:
        client.infer(server.model_name, {"pixels": ("UINT8", random_tiles(2, seed=2))})
    assert "RESOURCE_EXHAUSTED" in err.value.status, err.value
    assert "received message larger than max" in err.value.message.lower(), err.value
