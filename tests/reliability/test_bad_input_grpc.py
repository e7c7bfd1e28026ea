"""Bad-input corpus over V2 gRPC: documented status code, a message naming the problem, and
a correct answer to a valid request from an outside client (tritonclient) right after each.

Malformed messages are built with kserve's own protobufs, in this process, since an
outside client would refuse to build most of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

from harness.grpc_client import GrpcClient
from harness.server import Server
from harness.tiles import random_tiles
from histoserve.wire import length_prefixed
from tests.reliability.corpus import GENES, bomb, counts, image, truncated
from tests.reliability.corpus_jpeg import CASES as JPEG_CASES
from tests.reliability.corpus_jpeg import Triple
from tests.reliability.load import MAX_BODY_BYTES, MAX_TILES
from tests.reliability.traffic import RawGrpc, TilePool

pytestmark = pytest.mark.integration
Tensor = pb.ModelInferRequest.InferInputTensor
Contents = pb.InferTensorContents


@dataclass(frozen=True)
class GrpcCase:
    """One malformed gRPC request (built for a model name) and the status it must get."""

    name: str
    build: Callable[[str], pb.ModelInferRequest]
    words: tuple[str, ...]
    code: str = "INVALID_ARGUMENT"
    model: str = "embedding"


def request(model: str, *tensors: Any, raw: tuple[bytes, ...] = (), **extra: Any):
    return pb.ModelInferRequest(
        model_name=model, inputs=list(tensors), raw_input_contents=list(raw), **extra
    )


def pixels(shape: list[int], datatype: str = "UINT8", **contents: Any) -> Any:
    kwargs = {"contents": Contents(**contents)} if contents else {}
    return Tensor(name="pixels", datatype=datatype, shape=shape, **kwargs)


def tiles(n: int, **contents: Any) -> Any:
    kwargs = {"contents": Contents(**contents)} if contents else {}
    return Tensor(name="tiles", datatype="BYTES", shape=[n], **kwargs)


def tile_bytes(n: int = 1) -> bytes:
    return random_tiles(n, seed=11).tobytes()


def rna(*rows: list[float]) -> tuple[Any, bytes]:
    array = np.asarray(rows, np.float32)
    return Tensor(name="bulk_rna", datatype="FP32", shape=list(array.shape)), array.tobytes()


def with_rna(model: str, *rows: list[float]) -> pb.ModelInferRequest:
    tensor, data = rna(*rows)
    return request(
        model, pixels([len(rows), 224, 224, 3]), tensor, raw=(tile_bytes(len(rows)), data)
    )


def jpeg(model: str, build: Callable[[], Triple]) -> pb.ModelInferRequest:
    """A jpeg-transport request: ``jpeg_tiles`` length-prefixed, layout and boxes raw INT32."""
    streams, layout, boxes = build()
    return request(
        model,
        Tensor(name="jpeg_boxes", datatype="INT32", shape=list(boxes.shape)),
        Tensor(name="jpeg_layout", datatype="INT32", shape=list(layout.shape)),
        Tensor(name="jpeg_tiles", datatype="BYTES", shape=[len(streams)]),
        raw=(boxes.tobytes(), layout.tobytes(), length_prefixed(streams)),
    )


SHAPE = [1, 224, 224, 3]
CASES = [
    GrpcCase("grpc-raw-too-short", lambda m: request(m, pixels(SHAPE), raw=(tile_bytes()[:-1],)),
             ("'pixels'", "needs 150528 bytes", "150527")),
    GrpcCase("grpc-raw-count-mismatch",
             lambda m: request(m, pixels(SHAPE), raw=(tile_bytes(), b"x")),
             ("number of inputs (1)", "raw input contents (2)")),
    GrpcCase("grpc-raw-and-contents",
             lambda m: request(m, pixels([1, 1, 1, 3], uint_contents=[1, 2, 3]), raw=(b"abc",)),
             ("contents field must not be specified", "'pixels'")),
    GrpcCase("grpc-length-prefix-overruns",
             lambda m: request(m, tiles(1), raw=(b"\xe7\x03\x00\x00abc",)),
             ("'tiles'", "length 999 overruns")),
    GrpcCase("grpc-not-an-image", lambda m: request(m, tiles(1, bytes_contents=[b"hello"])),
             ("'tiles'", "tile 0", "not a PNG, JPEG, TIFF image")),
    GrpcCase("grpc-truncated-png",
             lambda m: request(m, tiles(2, bytes_contents=[image("PNG"), truncated("PNG")])),
             ("'tiles'", "tile 1", "truncated or corrupt PNG")),
    GrpcCase("grpc-truncated-tiff",
             lambda m: request(m, tiles(1), raw=(length_prefixed([truncated("TIFF")]),)),
             ("'tiles'", "tile 0", "TIFF")),
    GrpcCase("grpc-png-bomb", lambda m: request(m, tiles(1), raw=(length_prefixed([bomb("PNG")]),)),
             ("'tiles'", "tile 0", "4000x4000", "limit")),
    GrpcCase("grpc-uint8-out-of-range",
             lambda m: request(m, pixels([1, 1, 1, 3], uint_contents=[1, 2, 300])),
             ("'pixels'", "300", "out of range")),
    GrpcCase("grpc-mode-not-a-string",
             lambda m: request(m, pixels(SHAPE), raw=(tile_bytes(),),
                               parameters={"mode": pb.InferParameter(int64_param=3)}),
             ("'mode'", "must be a string")),
    GrpcCase("grpc-unknown-mode",
             lambda m: request(m, pixels(SHAPE), raw=(tile_bytes(),),
                               parameters={"mode": pb.InferParameter(string_param="segment")}),
             ("mode", "segment")),
    GrpcCase("grpc-unknown-output",
             lambda m: request(m, pixels(SHAPE), raw=(tile_bytes(),),
                               outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="x")]),
             ("'x'", "not produced")),
    GrpcCase("grpc-no-inputs", lambda m: request(m), ("no inputs",)),
    GrpcCase("grpc-unknown-input",
             lambda m: request(m, Tensor(name="image", datatype="BYTES", shape=[1],
                                         contents=Contents(bytes_contents=[b"x"]))),
             ("'image'", "unknown input")),
    GrpcCase("grpc-negative-shape",
             lambda m: request(m, pixels([-1, 224, 224, 3]), raw=(tile_bytes(),)),
             ("'pixels'", "negative dimension")),
    GrpcCase("grpc-huge-dimensions",
             lambda m: request(m, pixels([1, 100_000, 100_000, 3]), raw=(b"\x00" * 3,)),
             ("'pixels'", "100000x100000", "limit")),
    GrpcCase("grpc-wrong-datatype",
             lambda m: request(m, pixels([1, 1, 1, 3], "FP32"), raw=(b"\x00" * 12,)),
             ("'pixels'", "datatype must be UINT8")),
    GrpcCase("grpc-empty-batch", lambda m: request(m, tiles(0), raw=(b"",)),
             ("'tiles'", "N is 0")),
    GrpcCase("grpc-too-many-tiles",
             lambda m: request(m, tiles(MAX_TILES + 1),
                               raw=(length_prefixed([image("PNG")] * (MAX_TILES + 1)),)),
             ("'tiles'", f"{MAX_TILES + 1} tiles", "limit")),
    GrpcCase("grpc-oversize-message",
             lambda m: request(m, tiles(1), raw=(b"\x00" * (MAX_BODY_BYTES + 1),)),
             ("larger than max",), code="RESOURCE_EXHAUSTED"),
    GrpcCase("grpc-unknown-model",
             lambda m: request("no-such-model", pixels(SHAPE), raw=(tile_bytes(),)),
             ("no-such-model",), code="NOT_FOUND"),
    GrpcCase("grpc-bulk-rna-on-image-model", lambda m: with_rna(m, counts(1.0)),
             ("'bulk_rna'", "takes no bulk RNA")),
    GrpcCase("grpc-bulk-rna-nan", lambda m: with_rna(m, counts(1.0), counts(float("nan"))),
             ("'bulk_rna'", "tile 1", "non-finite"), model="multimodal"),
    GrpcCase("grpc-bulk-rna-negative", lambda m: with_rna(m, counts(-3.0)),
             ("'bulk_rna'", "tile 0", "negative"), model="multimodal"),
    GrpcCase("grpc-bulk-rna-wrong-gene-count", lambda m: with_rna(m, [1.0] * (GENES - 2)),
             ("'bulk_rna'", "tile 0", f"expected {GENES} gene counts"), model="multimodal"),
    *(GrpcCase(f"grpc-{c.name}", lambda m, c=c: jpeg(m, c.build), c.words) for c in JPEG_CASES),
]  # fmt: skip
BY_NAME = {c.name: c for c in CASES}


def test_the_grpc_corpus_names_are_unique():
    assert len(BY_NAME) == len(CASES) >= 20


@pytest.fixture(scope="module")
def servers(limited_server: Server, multimodal_server: Server) -> dict[str, Server]:
    return {"embedding": limited_server, "multimodal": multimodal_server}


@pytest.fixture(scope="module")
def raw_clients(servers: dict[str, Server]) -> Iterator[dict[str, RawGrpc]]:
    clients = {k: RawGrpc(s.grpc_url) for k, s in servers.items()}
    yield clients
    for c in clients.values():
        c.close()


@pytest.fixture(scope="module")
def outside_client(limited_server: Server) -> Iterator[GrpcClient]:
    client = GrpcClient(limited_server.grpc_url)
    yield client
    client.close()


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_bad_grpc_request_gets_its_status_and_a_message_naming_the_problem(
    name: str,
    servers: dict[str, Server],
    raw_clients: dict[str, RawGrpc],
    outside_client: GrpcClient,
    tile_pool: TilePool,
):
    case = BY_NAME[name]
    code, details, _ = raw_clients[case.model].infer(case.build(servers[case.model].model_name))
    assert code == case.code, f"{name}: {code} {details}"
    for word in case.words:
        assert word.lower() in details.lower(), f"{name}: {word!r} not in {details!r}"
    ids = tile_pool.pick(client=sorted(BY_NAME).index(name), seq=1)
    out = outside_client.infer(
        servers["embedding"].model_name, {"pixels": ("UINT8", tile_pool.tiles[ids])}
    )
    assert tile_pool.matches(ids, out["embedding"])
