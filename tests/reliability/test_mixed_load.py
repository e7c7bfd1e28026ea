"""Mixed load: 64 concurrent clients send valid and invalid requests over every protocol.

Every valid request must come back 200 with exactly its own tiles' embeddings, in order
(each client owns its tiles, so a response handed to the wrong request cannot match);
every invalid one 400; nothing lost, nothing mixed up, no 5xx for client input. The
server's own count of tiles served must equal the client's count of tiles answered.
"""

from __future__ import annotations

import pytest

from harness.server import Server
from tests.reliability.load import (
    CLIENTS,
    env_float,
    metric_value,
    percentile,
    record_figures,
    run_clients,
    summarise,
    target,
)
from tests.reliability.traffic import INVALID_SENDERS, VALID_SENDERS, Outcome, TilePool, mixed_job

pytestmark = pytest.mark.integration


def ok_tiles(server: Server) -> float:
    return metric_value(server.metrics(), "histoserve_tiles_total", outcome="ok")


def run_mixed(server: Server, pool: TilePool, duration_s: float, max_per_client: int) -> dict:
    """Runs the mixed load, checks every promise, and returns the figures."""
    with target(server, pool) as t:
        served_before = ok_tiles(server)
        outcomes = run_clients(
            CLIENTS, mixed_job(t), duration_s=duration_s, max_per_client=max_per_client
        )
        served = ok_tiles(server) - served_before
    summary = summarise(outcomes)
    assert not summary.lost, summary.lost[:5]
    assert not summary.mixed_up, summary.mixed_up[:5]
    assert not summary.wrong_status, summary.wrong_status[:5]
    assert summary.server_errors_for_client_input == 0
    assert {o.kind for o in outcomes} == set(VALID_SENDERS) | set(INVALID_SENDERS)
    answered = sum(o.tiles for o in outcomes if o.status == 200)
    assert served == answered, f"server served {served} tiles, clients got {answered}"
    return figures(summary.figures(), outcomes, answered)


def figures(base: dict, outcomes: list[Outcome], tiles: int) -> dict:
    valid = [o.latency_s for o in outcomes if o.expect == 200]
    wall = base["wall_s"] or 1.0
    return base | {
        "clients": CLIENTS,
        "valid": len(valid),
        "invalid": len(outcomes) - len(valid),
        "tiles_answered": tiles,
        "requests_per_s": round(len(outcomes) / wall, 1),
        "valid_p50_ms": round(1000 * percentile(valid, 50)),
        "valid_p99_ms": round(1000 * percentile(valid, 99)),
    }


def test_mixed_load_loses_and_mixes_up_nothing(limited_server: Server, tile_pool: TilePool):
    result = run_mixed(limited_server, tile_pool, duration_s=8.0, max_per_client=10)
    assert result["sent"] >= CLIENTS * 3
    record_figures("mixed_load", result)


@pytest.mark.slow
def test_mixed_load_long(limited_server: Server, tile_pool: TilePool):
    duration = env_float("HISTOSERVE_LOAD_S", 120.0)
    result = run_mixed(limited_server, tile_pool, duration_s=duration, max_per_client=100_000)
    record_figures("mixed_load_long", result)
