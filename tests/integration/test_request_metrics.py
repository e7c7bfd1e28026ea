"""``/metrics`` of a live server after known traffic: every count is what the traffic made.

The per-request metrics are bound once per model now (``predictor.model.metrics``
and ``Pipeline.__call__``); this scrape checks that nothing was lost or
double counted on the way, over REST and gRPC, for good and bad requests,
and that the names, labels and help texts are the ones the contract lists.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.grpc_client import GrpcClient, GrpcError
from harness.server import Server, start_server
from harness.tiles import random_tiles
from histoserve import HistoserveClient, InferenceError
from predictor.device.cpus import available_cpus, resolve_instances

pytestmark = pytest.mark.integration

HELP = {
    "histoserve_batch_size": "Tiles per forward call.",
    "histoserve_queue_depth": "Tiles waiting for a batch.",
    "histoserve_inflight_requests": "Requests being served.",
    "histoserve_tiles": "Tiles by outcome.",
    "histoserve_queue_wait_seconds": "Enqueue to dispatch, per tile.",
    "histoserve_forward_seconds": "Forward pass per batch (incl. copies).",
    "histoserve_preprocess_seconds": "Stage 1 (decode, validate) per request.",
    "histoserve_device_forwards": "Forward calls per device worker, by outcome (ok, failed).",
    "histoserve_device_up": (
        "1 while a device worker serves; 0 once a fatal device error took it out."
    ),
    "request_preprocess_seconds": "pre-process request latency",
    "request_predict_seconds": "predict request latency",
    "request_postprocess_seconds": "post-process request latency",
}
REST_OK, GRPC_OK, REST_BAD, GRPC_BAD = 4, 3, 2, 1


@pytest.fixture(scope="module")
def server(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    server = start_server(
        embedding_package_dir, tmp_path_factory.mktemp("scrape"), "--max_batch_size", "8"
    )
    yield server
    server.stop()


def _send_known_traffic(server: Server) -> None:
    tile = random_tiles(1, seed=7)
    wrong_size = np.zeros((1, 100, 100, 3), dtype=np.uint8)
    with HistoserveClient(server.base, server.model_name) as client:
        for _ in range(REST_OK):
            assert client.infer_pixels(tile)["embedding"].shape == (1, 1536)
        for _ in range(REST_BAD):
            with pytest.raises(InferenceError) as caught:
                client.infer_pixels(wrong_size)
            assert caught.value.status == 400
    grpc = GrpcClient(server.grpc_url)
    try:
        for _ in range(GRPC_OK):
            out = grpc.infer(server.model_name, {"pixels": ("UINT8", tile)})
            assert out["embedding"].shape == (1, 1536)
        for _ in range(GRPC_BAD):
            with pytest.raises(GrpcError, match="INVALID_ARGUMENT"):
                grpc.infer(server.model_name, {"pixels": ("UINT8", wrong_size)})
    finally:
        grpc.close()


@pytest.fixture(scope="module")
def families(server: Server) -> dict[str, object]:
    """``/metrics`` parsed, after exactly the known traffic (sent once per module)."""
    _send_known_traffic(server)
    text = httpx.get(f"{server.base}/metrics", timeout=30).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def _samples(families: dict, family: str, sample: str, **labels: str) -> list[float]:
    """Every matching series' value (one per device worker for the per-worker families)."""
    return [
        s.value
        for s in families[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def _value(families: dict, family: str, sample: str, **labels: str) -> float:
    values = _samples(families, family, sample, **labels)
    assert len(values) == 1, (sample, labels, families[family].samples)
    return values[0]


def test_metrics_count_exactly_the_traffic_sent(server: Server, families: dict) -> None:
    model = server.model_name
    ok, bad = REST_OK + GRPC_OK, REST_BAD + GRPC_BAD
    for stage, want in (("preprocess", ok + bad), ("predict", ok), ("postprocess", ok)):
        name = f"request_{stage}_seconds"
        assert _value(families, name, f"{name}_count", model_name=model) == want, stage
    assert _value(families, "histoserve_tiles", "histoserve_tiles_total", outcome="ok") == ok
    assert _value(families, "histoserve_tiles", "histoserve_tiles_total", outcome="invalid") == bad
    assert (
        _value(
            families,
            "histoserve_preprocess_seconds",
            "histoserve_preprocess_seconds_count",
            model=model,
        )
        == ok
    )
    assert (
        _value(
            families,
            "histoserve_queue_wait_seconds",
            "histoserve_queue_wait_seconds_count",
            model=model,
            priority="2",  # no priority sent: the default class, bulk
        )
        == ok
    )
    assert _value(families, "histoserve_batch_size", "histoserve_batch_size_sum", model=model) == ok
    assert _value(families, "histoserve_inflight_requests", "histoserve_inflight_requests") == 0
    assert _value(families, "histoserve_queue_depth", "histoserve_queue_depth", priority="2") == 0
    forwards = _value(
        families, "histoserve_forward_seconds", "histoserve_forward_seconds_count", model=model
    )
    per_worker = _samples(
        families, "histoserve_device_forwards", "histoserve_device_forwards_total", outcome="ok"
    )
    assert sum(per_worker) == forwards
    assert 1 <= forwards <= ok
    up = _samples(families, "histoserve_device_up", "histoserve_device_up", model=model)
    workers = resolve_instances(None, "cpu", available_cpus())  # the server's default
    assert len(up) == workers and set(up) == {1.0}  # every device worker serves
    assert 1 <= len(per_worker) <= workers


def test_names_labels_and_help_texts_are_the_contract(families: dict) -> None:
    assert {name: families[name].documentation for name in HELP} == HELP
    labels = {
        name: {key for sample in families[name].samples for key in sample.labels} - {"le"}
        for name in HELP
    }
    assert labels["histoserve_tiles"] == {"model", "outcome"}
    assert labels["histoserve_device_forwards"] == {"model", "worker", "outcome"}
    assert labels["histoserve_device_up"] == {"model", "worker"}
    assert labels["request_predict_seconds"] == {"model_name"}
    assert labels["histoserve_batch_size"] == {"model"}


def test_server_froze_its_startup_heap_after_loading(server: Server) -> None:
    log = server.log()
    frozen = [line for line in log.splitlines() if "start-up objects frozen" in line]
    assert len(frozen) == server.processes, log[-3000:]  # one per process
    assert "thresholds (700, 10, 10)" in frozen[0]
    assert log.index("serving ") < log.index("start-up objects frozen")  # after the model loaded
