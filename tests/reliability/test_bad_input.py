"""Bad-input corpus over REST (V1, V2 JSON, V2 binary): documented status, a message naming
the problem, and a correct answer to a valid request right after each one. No 500 anywhere.

The gRPC rows live in ``test_bad_input_grpc.py``; together they are well over 40 cases.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from harness.packages import package_in
from harness.reference import Reference, normalise_reference
from harness.server import Server
from tests.reliability.corpus import V1_CASES, HttpCase
from tests.reliability.corpus_binary import BINARY_CASES
from tests.reliability.corpus_jpeg import JPEG_CASES
from tests.reliability.corpus_v2 import V2_JSON_CASES
from tests.reliability.load import access_log_statuses
from tests.reliability.traffic import (
    Target,
    TilePool,
    error_of,
    make_target,
    send_binary_pixels,
)

pytestmark = pytest.mark.integration
CASES = {c.name: c for c in (*V1_CASES, *V2_JSON_CASES, *BINARY_CASES, *JPEG_CASES)}
CHUNK = 64 * 1024


def test_the_corpus_is_large_and_its_names_unique():
    names = [c.name for c in (*V1_CASES, *V2_JSON_CASES, *BINARY_CASES, *JPEG_CASES)]
    assert len(names) == len(set(names)) >= 40
    assert {c.route for c in CASES.values()} == {"v1", "v2"}
    assert any(n.startswith("bin-") for n in names)


@pytest.fixture(scope="module")
def targets(
    limited_server: Server, multimodal_server: Server, tile_pool: TilePool
) -> Iterator[dict[str, Target]]:
    made = {
        "embedding": make_target(limited_server, tile_pool),
        "multimodal": make_target(multimodal_server, tile_pool),
    }
    yield made
    for t in made.values():
        t.close()


@pytest.fixture(scope="module")
def multimodal_reference(multimodal_package_dir: Path) -> Reference:
    return Reference(package_in(multimodal_package_dir))


def send_case(t: Target, case: HttpCase) -> httpx.Response:
    """Posts the case's body (JSON, malformed text or binary; streamed when chunked)."""
    body = case.build()
    if isinstance(body, tuple):
        content, headers = body
    elif isinstance(body, bytes):
        content, headers = body, {"content-type": "application/json"}
    else:
        content, headers = json.dumps(body).encode(), {"content-type": "application/json"}
    if case.chunked:
        data = content
        content = iter([data[i : i + CHUNK] for i in range(0, len(data), CHUNK)])
    url = t.v1_url if case.route == "v1" else t.infer_url
    return t.http.post(url, content=content, headers=headers)


def assert_still_serving(t: Target, which: str, seq: int, mm_reference: Reference) -> None:
    """A valid request right after the bad one gets the right numbers."""
    ids = t.pool.pick(client=seq % t.pool.clients, seq=seq)
    mode = "embedding" if which == "multimodal" else None
    status, message, got, _ = send_binary_pixels(t, ids, mode)
    assert status == 200, message
    if which == "embedding":
        assert t.pool.matches(ids, got)
        return
    tiles = t.pool.tiles[ids]
    absent = torch.full((len(ids), 64), float("nan"))
    want = mm_reference(normalise_reference(tiles), absent)
    assert got is not None and np.allclose(got, want[1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_request_gets_its_status_and_a_message_naming_the_problem(
    name: str, targets: dict[str, Target], multimodal_reference: Reference
):
    case = CASES[name]
    t = targets[case.model]
    response = send_case(t, case)
    message = error_of(response)
    assert response.status_code == case.status, f"{name}: {response.status_code} {message}"
    assert response.json().keys() == {"error"}, response.text
    for word in case.words:
        assert word.lower() in message.lower(), f"{name}: {word!r} not in {message!r}"
    assert_still_serving(t, case.model, sorted(CASES).index(name), multimodal_reference)


def test_no_500_anywhere(limited_server: Server, multimodal_server: Server):
    for server in (limited_server, multimodal_server):
        statuses = access_log_statuses(server)
        assert statuses[200] and statuses[400], statuses
        assert not [s for s in statuses if s >= 500], statuses
