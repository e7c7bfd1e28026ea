"""Issue 53, case 5: jpeg requests are admitted by what they cost to decode, not by their tiles.

A jpeg request at the pixel budget (2 x 2 slide tiles as large as the limited
server allows, one box over each) carries 4 tiles and asks stage 1 for as
much decoding as 1,000 raw tiles' worth of bytes would. Before, it counted
4 tiles against the 1,024-tile queue: any number of them were admitted and
every other request waited behind their decoding. Now stage 1 holds at most
``--max_decode_pixels`` of them (three budgets: one such request and room for
ordinary ones): a flood of them gets fast 503s with ``Retry-After`` naming
the decode budget, while ordinary requests, raw pixels and small jpeg
requests alike, are admitted and answered correctly all along. Their latency
under the flood is a benchmark's (``bench/studies/jpeg_flood.py``), not a
test's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from harness.server import Server
from tests.reliability.corpus_jpeg import Triple, flat_jpeg, rest_body
from tests.reliability.load import MAX_DECODE_PIXELS, MAX_IMAGE_PIXELS, MAX_REQUEST_PIXELS
from tests.reliability.traffic import TilePool, error_of, make_target, send_binary_pixels

pytestmark = pytest.mark.integration
EDGE = 1024  # a slide tile as large as the limited server allows: 2 x 2 of them fill the budget
FLOODERS = 8
FLOOD_S = 3.0


def at_the_budget() -> Triple:
    """2 x 2 slide tiles of ``EDGE`` px and one ``EDGE`` px box over each: 8 Mi px to decode."""
    layout = [[EDGE * (i % 2), EDGE * (i // 2), EDGE, EDGE] for i in range(4)]
    streams = [flat_jpeg(EDGE, i) for i in range(4)]
    rows = np.asarray(layout, np.int32)
    return streams, rows, rows.copy()


def ordinary() -> Triple:
    """One model tile over one 256 px slide tile: what a client's request is made of."""
    return (
        [flat_jpeg(256, 7)],
        np.asarray([[0, 0, 256, 256]], np.int32),
        np.asarray([[16, 16, 224, 224]], np.int32),
    )


def test_the_heavy_request_is_what_the_issue_sends_scaled_to_the_limits() -> None:
    assert EDGE * EDGE == MAX_IMAGE_PIXELS and 4 * EDGE * EDGE == MAX_REQUEST_PIXELS
    assert 2 * MAX_REQUEST_PIXELS <= MAX_DECODE_PIXELS < 2 * (2 * MAX_REQUEST_PIXELS)


def test_a_flood_of_costly_jpeg_requests_is_refused_while_ordinary_ones_are_served(
    limited_server: Server, tile_pool: TilePool
) -> None:
    heavy_body, heavy_headers = rest_body(at_the_budget)
    small_body, small_headers = rest_body(ordinary)
    heavy: list[tuple[int, str, str | None]] = []
    normal: list[tuple[str, int, str, bool]] = []
    stop = threading.Event()
    t = make_target(limited_server, tile_pool)
    try:
        alone = t.http.post(t.infer_url, content=heavy_body, headers=heavy_headers)
        assert alone.status_code == 200, error_of(alone)  # alone, it is served

        def flood() -> None:
            while not stop.is_set():
                r = t.http.post(t.infer_url, content=heavy_body, headers=heavy_headers)
                heavy.append((r.status_code, error_of(r), r.headers.get("retry-after")))

        def ordinary_client(send: Callable[[], tuple[str, int, str, bool]]) -> None:
            while not stop.is_set():
                normal.append(send())
                time.sleep(0.05)

        def pixels() -> tuple[str, int, str, bool]:
            ids = t.pool.pick(0, len(normal))
            status, message, got, _ = send_binary_pixels(t, ids)
            return "pixels", status, message, status == 200 and t.pool.matches(ids, got)

        def small_jpeg() -> tuple[str, int, str, bool]:
            r = t.http.post(t.infer_url, content=small_body, headers=small_headers)
            return "jpeg", r.status_code, error_of(r), r.status_code == 200

        threads = [threading.Thread(target=flood) for _ in range(FLOODERS)]
        threads += [
            threading.Thread(target=ordinary_client, args=(f,)) for f in (pixels, small_jpeg)
        ]
        for thread in threads:
            thread.start()
        time.sleep(FLOOD_S)
        stop.set()
        for thread in threads:
            thread.join(60)
    finally:
        t.close()
    refused = [h for h in heavy if h[0] == 503]
    assert {status for status, *_ in heavy} <= {200, 503}, heavy
    assert refused, f"{len(heavy)} costly requests, none refused"
    for _, message, retry_after in refused:
        assert "decode budget full" in message and "max_decode_pixels" in message, message
        assert retry_after is not None and int(retry_after) >= 1
    assert {kind for kind, *_ in normal} == {"pixels", "jpeg"}
    bad = [n for n in normal if not (n[1] == 200 and n[3])]
    assert not bad, bad[:3]
