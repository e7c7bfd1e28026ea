"""``--metrics_port`` end to end: ``/metrics`` on a port of its own, from a real server.

What the chart relies on when its NetworkPolicy admits Prometheus to that
port only: the series there are the inference port's (the same registry,
counts included), nothing but ``/metrics`` answers there, and under
``--frontends N`` exactly one process (the device owner) listens on it and
serves the series of every process summed. A port that cannot be bound is a
start-up error (exit 2, one line), before the model loads.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.listeners import listening_addresses
from harness.server import Server, free_port, predictor_command, start_server
from harness.tiles import random_tiles
from histoserve import HistoserveClient

pytestmark = pytest.mark.integration

SENT = 3


def _tiles_ok(text: str) -> float:
    """``histoserve_tiles_total{outcome="ok"}`` summed over series."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "histoserve_tiles_total" and s.labels.get("outcome") == "ok"
    )


def _send(server: Server) -> None:
    with HistoserveClient(server.base, server.model_name) as client:
        for _ in range(SENT):
            assert client.infer_pixels(random_tiles(1, seed=3))["embedding"].shape == (1, 1536)


def _scrape(port: int, path: str = "/metrics") -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)


@pytest.fixture(scope="module")
def one_process(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, int]]:
    port = free_port()
    server = start_server(
        embedding_package_dir,
        tmp_path_factory.mktemp("metrics-port"),
        "--metrics_port",
        str(port),
        "--frontends",
        "1",
    )
    yield server, port
    server.stop()


def test_the_metrics_port_serves_the_inference_ports_registry(one_process):
    server, port = one_process
    _send(server)
    own, shared = _scrape(port), httpx.get(f"{server.base}/metrics", timeout=10)
    assert own.status_code == 200 and shared.status_code == 200
    assert own.headers["content-type"].startswith("text/plain")
    assert _tiles_ok(own.text) == _tiles_ok(shared.text) == SENT
    families = {f.name for f in text_string_to_metric_families(own.text)}
    assert {"histoserve_queue_depth", "histoserve_inflight_requests"} <= families


def test_the_metrics_port_serves_nothing_else(one_process):
    server, port = one_process
    for path in ("/", f"/v2/models/{server.model_name}/ready", "/v2/health/live"):
        assert _scrape(port, path).status_code == 404, path
    assert listening_addresses(port) == ["0.0.0.0"]  # reached on the pod IP, as the HTTP port


def test_several_front_ends_one_owner_listener_with_summed_series(
    embedding_package_dir: Path, tmp_path: Path
):
    port = free_port()
    server = start_server(
        embedding_package_dir, tmp_path, "--metrics_port", str(port), "--frontends", "2"
    )
    try:
        _send(server)
        assert len(listening_addresses(port)) == 1  # the owner's; the front ends bind none
        assert _tiles_ok(_scrape(port).text) == SENT  # counted in the front ends, summed
    finally:
        assert server.stop() == 0


def test_a_port_in_use_is_a_startup_error(embedding_package_dir: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = predictor_command(
            embedding_package_dir, (free_port(), free_port()), "--device", "cpu",
            "--metrics_port", str(port), "--bind_address", "127.0.0.1",
        )  # fmt: skip
        proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"cannot listen on --metrics_port {port}" in proc.stderr
    assert "model built" not in proc.stderr  # refused before the package is loaded
