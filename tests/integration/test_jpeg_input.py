"""The server's ``jpeg_tiles`` / ``jpeg_layout`` / ``jpeg_boxes`` inputs, REST binary and gRPC.

Against the session's embedding server on loopback: boxes across two slide
tiles answer what the same pixels sent raw answer, bit for bit; a hostile
JPEG (truncated, bad tables, a huge declared size) is a 400 naming
``jpeg_tiles`` and its tile, and a good request sent alongside is answered.
"""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import simplejpeg

from harness import slides
from harness.grpc_client import GrpcClient, GrpcError
from harness.server import Server
from histoserve import wire

pytestmark = pytest.mark.integration
SLIDE_TILE = 256


def _slide_tiles() -> list[np.ndarray]:
    texture = slides.he_tile()
    base = np.tile(texture, (2, 3, 1))[:SLIDE_TILE, : 2 * SLIDE_TILE]
    return [np.ascontiguousarray(base[:, i * SLIDE_TILE : (i + 1) * SLIDE_TILE]) for i in (0, 1)]


def _request(size: int, streams: list[bytes]) -> dict[str, np.ndarray]:
    layout = np.array([[0, 0, SLIDE_TILE, SLIDE_TILE], [SLIDE_TILE, 0, SLIDE_TILE, 200]], np.int32)
    boxes = np.array([[0, 0, size, size], [150, 10, size, size], [300, 20, size, size]], np.int32)
    tiles = np.empty(len(streams), np.object_)
    tiles[:] = streams
    return {"jpeg_boxes": boxes, "jpeg_layout": layout, "jpeg_tiles": tiles}


def _same_pixels(size: int, streams: list[bytes]) -> np.ndarray:
    """What the server composes: each box from the decoded tiles, white where none covers it."""
    frame = np.full((SLIDE_TILE + size, 2 * SLIDE_TILE + size, 3), 255, np.uint8)
    for i, stream in enumerate(streams):
        decoded = simplejpeg.decode_jpeg(
            stream, colorspace="RGB", fastdct=False, fastupsample=False
        )
        valid = (SLIDE_TILE, 200)[i]
        frame[:valid, i * SLIDE_TILE : (i + 1) * SLIDE_TILE] = decoded[:valid]
    boxes = _request(size, streams)["jpeg_boxes"]
    return np.stack([frame[y : y + size, x : x + size] for x, y, _, _ in boxes])


def _post(server: Server, inputs: dict[str, np.ndarray]) -> httpx.Response:
    body, headers = wire.encode_request(inputs, parameters={"mode": "embedding"})
    url = f"{server.base}/v2/models/{server.model_name}/infer"
    return httpx.post(url, content=body, headers=headers, timeout=60, trust_env=False)


def _embedding(reply: httpx.Response) -> np.ndarray:
    assert reply.status_code == 200, reply.text
    outputs, _ = wire.decode_response(reply.content, reply.headers.get(wire.HEADER))
    return outputs["embedding"]


@pytest.fixture(scope="module")
def streams() -> list[bytes]:
    return [simplejpeg.encode_jpeg(t, quality=90, colorspace="RGB") for t in _slide_tiles()]


@pytest.fixture(scope="module")
def tile_size(embedding_server: Server) -> int:
    config = httpx.get(f"{embedding_server.base}/v2/models/{embedding_server.model_name}/config")
    assert config.json()["transports"] == ["pixels", "jpeg"]
    return int(config.json()["spec"]["tile_size"])


def test_boxes_across_slide_tiles_answer_as_the_same_pixels_raw(
    embedding_server: Server, streams: list[bytes], tile_size: int
) -> None:
    jpeg = _embedding(_post(embedding_server, _request(tile_size, streams)))
    pixels = _embedding(_post(embedding_server, {"pixels": _same_pixels(tile_size, streams)}))
    assert jpeg.shape[0] == 3
    np.testing.assert_array_equal(jpeg, pixels)


def _huge(stream: bytes) -> bytes:
    at = stream.index(b"\xff\xc0") + 5  # SOF0: length (2), precision (1), then height, width
    return stream[:at] + struct.pack(">HH", 60000, 60000) + stream[at + 4 :]


def _bad_tables(stream: bytes) -> bytes:
    at = stream.index(b"\xff\xc4") + 4  # DHT: its table class and counts garbled
    return stream[:at] + b"\xff" * 17 + stream[at + 17 :]


HOSTILE = {"truncated": lambda s: s[: len(s) // 2], "bad tables": _bad_tables, "huge": _huge}


@pytest.mark.parametrize("how", sorted(HOSTILE))
def test_a_hostile_jpeg_is_a_400_naming_its_tile_and_a_request_beside_it_is_answered(
    embedding_server: Server, streams: list[bytes], tile_size: int, how: str
) -> None:
    bad = _request(tile_size, [streams[0], HOSTILE[how](streams[1])])
    good = _request(tile_size, streams)
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda i: _post(embedding_server, i), (bad, good, bad, good)))
    for reply in replies[0::2]:
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert "jpeg_tiles" in error and "tile 1" in error, error
    for reply in replies[1::2]:
        assert _embedding(reply).shape[0] == 3


def test_grpc_takes_jpeg_tiles_and_names_a_truncated_one(
    embedding_server: Server, streams: list[bytes], tile_size: int
) -> None:
    client = GrpcClient(embedding_server.grpc_url)
    try:

        def typed(inputs: dict[str, np.ndarray]) -> dict[str, tuple[str, np.ndarray]]:
            kinds = {"jpeg_tiles": "BYTES", "jpeg_layout": "INT32", "jpeg_boxes": "INT32"}
            return {name: (kinds[name], array) for name, array in inputs.items()}

        model = embedding_server.model_name
        answer = client.infer(model, typed(_request(tile_size, streams)), {"mode": "embedding"})
        rest = _embedding(_post(embedding_server, _request(tile_size, streams)))
        np.testing.assert_array_equal(answer["embedding"], rest)
        bad = _request(tile_size, [streams[0], streams[1][:100]])
        with pytest.raises(GrpcError) as caught:
            client.infer(model, typed(bad), {"mode": "embedding"})
        assert "INVALID_ARGUMENT" in caught.value.status
        assert "jpeg_tiles" in str(caught.value) and "tile 1" in str(caught.value)
    finally:
        client.close()
