"""``--instances_per_device N``: N device workers on one queue (CPU for now).

A real server with two instances and the GIL-free runner answers concurrent
clients with the in-process embeddings; the flag and config validate.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from harness.reference import Reference, normalise_reference
from predictor.cli import build_parser, configs_from_args
from predictor.client import HistoserveClient
from predictor.config import ModelConfig


def test_flag_and_config_validate() -> None:
    args = build_parser().parse_args(["--instances_per_device", "3"])
    assert configs_from_args(args)[0].instances_per_device == 3
    assert build_parser().parse_args([]).instances_per_device == 1
    with pytest.raises(ValueError, match="instances_per_device must be >= 1, got 0"):
        ModelConfig(instances_per_device=0)


@pytest.mark.integration
def test_two_instances_serve_concurrent_clients(
    embedding_package_dir: Path, tmp_path: Path
) -> None:
    from harness.server import start_server

    flags = ("--instances_per_device", "2", "--forward_runner", "gil_free", "--max_batch_size", "2")
    server = start_server(embedding_package_dir, tmp_path, *flags)
    rng = np.random.default_rng(9)
    requests = [rng.integers(0, 256, (2, 224, 224, 3), dtype=np.uint8) for _ in range(8)]

    def call(tiles: np.ndarray) -> np.ndarray:
        with HistoserveClient(server.base, server.model_name) as client:
            return client.infer_pixels(tiles)["embedding"]

    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(call, requests))
        metrics = server.metrics()
    finally:
        assert server.stop() == 0
    assert "2 device worker(s): cpu#0, cpu#1" in server.log()
    for worker in ("cpu#0", "cpu#1"):
        assert (
            f'histoserve_device_up{{model="{server.model_name}",worker="{worker}"}} 1.0' in metrics
        )
    assert "histoserve_device_forwards_total{" in metrics
    (package,) = sorted(embedding_package_dir.glob("*.pt2"))
    reference = Reference(package)
    for tiles, got in zip(requests, answers, strict=True):
        (want,) = reference(normalise_reference(tiles))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
