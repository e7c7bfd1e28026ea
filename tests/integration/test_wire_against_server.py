"""histoserve.wire's reader on what a real server sends (the ``embedding_server`` fixture).

The server's answers (binary and JSON outputs, named or not) decode to the
package's own embeddings of the same tiles, and a real answer cut short is
refused. The writer and reader alone are in ``tests/unit/histoserve/wire/test_wire.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness.packages import package_in
from harness.reference import Reference, normalise_reference
from harness.server import Server
from harness.tiles import encode_png, random_tiles
from histoserve import wire

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def embeddings_of(embedding_package_dir: Path) -> Callable[[np.ndarray], np.ndarray]:
    reference = Reference(package_in(embedding_package_dir))
    return lambda tiles: reference(normalise_reference(tiles))[0]


def _post(server: Server, body: bytes, headers: dict[str, str]) -> httpx.Response:
    url = f"{server.base}/v2/models/{server.model_name}/infer"
    response = httpx.post(url, content=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    return response


@pytest.mark.parametrize(
    ("outputs", "binary"),
    [(None, True), (["embedding"], True), (None, False), (["embedding"], False)],
    ids=["binary", "binary-named", "json", "json-named"],
)
def test_reader_decodes_what_the_server_sends(
    embedding_server: Server, embeddings_of, outputs: list[str] | None, binary: bool
) -> None:
    tiles = random_tiles(3, seed=21)
    pngs = [encode_png(t) for t in tiles]
    body, headers = wire.encode_request(
        {"tiles": pngs}, outputs=outputs, binary_outputs=binary, request_id="wire-1"
    )
    response = _post(embedding_server, body, headers)
    assert (wire.HEADER.lower() in response.headers) == binary
    got, header = wire.decode_response(response.content, response.headers.get(wire.HEADER))
    assert header["id"] == "wire-1" and list(got) == ["embedding"]
    assert got["embedding"].dtype == np.float32 and got["embedding"].shape == (3, 1536)
    np.testing.assert_allclose(got["embedding"], embeddings_of(tiles), atol=1e-4, rtol=1e-4)


def test_a_real_response_cut_short_is_refused(embedding_server: Server) -> None:
    body, headers = wire.encode_request({"pixels": random_tiles(1, seed=22)})
    response = _post(embedding_server, body, headers)
    length = response.headers[wire.HEADER]
    with pytest.raises(ValueError, match="overruns the body"):
        wire.decode_response(response.content[:-4], length)
