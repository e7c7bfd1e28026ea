"""histoserve.remote.client against a real server on loopback: pixels, images, modes and errors.

The server runs a real demo package with a queue of 8 tiles, so a 9-tile
request is refused deterministically with 503 and ``Retry-After`` (admission
refuses what can never fit, no race with other load).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness.packages import package_in
from harness.reference import Reference, normalise_reference
from harness.server import Server, start_server
from harness.tiles import encode_png, random_tiles
from histoserve.remote.auth import Credentials
from histoserve.remote.client import HistoserveClient, InferenceError
from histoserve.remote.http import Reply

pytestmark = pytest.mark.integration
ATOL = 1e-4
QUEUE_TILES = 8


@pytest.fixture(scope="module")
def server(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    flags = ("--max_batch_size", "4", "--max_queue_size", str(QUEUE_TILES))
    srv = start_server(embedding_package_dir, tmp_path_factory.mktemp("client"), *flags)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[HistoserveClient]:
    with HistoserveClient(server.base, server.model_name, timeout_s=120) as c:
        yield c


@pytest.fixture(scope="module")
def reference(embedding_package_dir: Path) -> Reference:
    return Reference(package_in(embedding_package_dir))


def test_pixels_give_the_packages_embeddings_in_order(
    client: HistoserveClient, reference: Reference
) -> None:
    tiles = random_tiles(5, seed=11)  # more than one batch of 4
    out = client.infer_pixels(tiles)
    assert list(out) == ["embedding"]
    assert out["embedding"].dtype == np.float32 and out["embedding"].shape == (5, 1536)
    expected = reference(normalise_reference(tiles))[0]
    np.testing.assert_allclose(out["embedding"], expected, atol=ATOL, rtol=ATOL)


def test_images_match_their_pixels(client: HistoserveClient, reference: Reference) -> None:
    tiles = random_tiles(3, seed=12)
    out = client.infer_images([encode_png(t) for t in tiles], mode="embedding")
    expected = reference(normalise_reference(tiles))[0]
    np.testing.assert_allclose(out["embedding"], expected, atol=ATOL, rtol=ATOL)


def test_metadata_and_config(client: HistoserveClient) -> None:
    meta = client.metadata()
    assert {i["name"] for i in meta["inputs"]} >= {"tiles", "pixels"}
    config = client.config()
    assert config["spec"]["name"] == "h0-mini"
    assert config["batching"]["max_batch_size"] == 4


def test_bad_tile_is_a_400_naming_input_tile_and_reason(client: HistoserveClient) -> None:
    png = encode_png(random_tiles(1, seed=13)[0])
    with pytest.raises(InferenceError) as err:
        client.infer_images([png, png[: len(png) // 2]])
    assert err.value.status == 400 and err.value.retry_after_s is None
    message = str(err.value)
    assert "'tiles'" in message and "tile 1" in message, message


def test_unknown_mode_is_a_400(client: HistoserveClient) -> None:
    with pytest.raises(InferenceError) as err:
        client.infer_pixels(random_tiles(1, seed=14), mode="segmentation")
    assert err.value.status == 400 and "segmentation" in str(err.value)


def test_request_larger_than_the_queue_is_503_with_retry_after(
    client: HistoserveClient,
) -> None:
    with pytest.raises(InferenceError) as err:
        client.infer_pixels(random_tiles(QUEUE_TILES + 1, seed=15))
    assert err.value.status == 503
    assert err.value.retry_after_s is not None and err.value.retry_after_s >= 1
    assert "queue full" in str(err.value)


def test_unknown_model_is_a_usage_error_naming_it(server: Server) -> None:
    """The model is described before any request: the server's 404, as a usage error."""
    from histoserve.errors import UsageError

    with (
        HistoserveClient(server.base, "no-such-model") as other,
        pytest.raises(UsageError) as err,
    ):
        other.infer_pixels(random_tiles(1, seed=16))
    assert "serves no model 'no-such-model'" in str(err.value) and "HTTP 404" in str(err.value)


@pytest.mark.parametrize(
    ("url", "timeout_s", "needle"),
    [("localhost:8080", 1.0, "http://"), ("http://localhost:8080", 0.0, "timeout_s")],
)
def test_constructor_refuses_bad_arguments(url: str, timeout_s: float, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        HistoserveClient(url, "m", timeout_s=timeout_s)


@pytest.mark.parametrize(
    ("retry_after", "expected"),
    [("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), ("2", 2.0), ("soon", None)],
    ids=["http-date", "seconds", "malformed"],
)
def test_retry_after_in_either_form_keeps_the_servers_error(
    retry_after: str, expected: float | None
) -> None:
    """A real httpx response (our server sends seconds only; a proxy may send a date)."""
    from histoserve.remote.transport import status_error

    headers = httpx.Headers({"retry-after": retry_after})
    reply = Reply("http://h/v2", 503, headers, json.dumps({"error": "busy"}).encode())
    error = status_error("http://h", reply, Credentials())
    assert "HTTP 503: busy" in str(error) and error.retry_after_s == expected


def test_every_request_reads_retry_after_with_one_parser() -> None:
    """Every request of the client core (describe too) meets its status in one place."""
    from histoserve.remote import transport
    from histoserve.remote.http import parse_retry_after

    assert transport.parse_retry_after is parse_retry_after
