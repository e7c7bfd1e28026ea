"""``--forward_runner gil_free``: the package through its C ABI with the GIL released.

Real demo package; outputs compared with torch's loader bit for bit, and a
real server started with the flag answers with the in-process embeddings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from harness.packages import demo_package
from harness.reference import Reference, normalise_reference
from predictor.cli import build_parser, configs_from_args
from predictor.client.histoserve import HistoserveClient
from predictor.config import ModelConfig
from predictor.package.aoti_runner import GilFreeRunner
from predictor.package.loader import load_package

CPU = torch.device("cpu")


def test_gil_free_package_equals_torchs() -> None:
    path = demo_package("h0-mini")
    torch_pkg = load_package(path, CPU)
    free_pkg = load_package(path, CPU, runner="gil_free")
    assert isinstance(free_pkg.runner, GilFreeRunner)
    assert free_pkg.metadata == torch_pkg.metadata
    assert free_pkg.embedded_spec == torch_pkg.embedded_spec
    x = torch.randn(3, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    (got,), (want,) = free_pkg(x), torch_pkg(x)
    assert torch.equal(got, want)


def test_flag_and_config_validate() -> None:
    args = build_parser().parse_args(["--forward_runner", "gil_free"])
    assert configs_from_args(args)[0].forward_runner == "gil_free"
    assert build_parser().parse_args([]).forward_runner == "torch"
    with pytest.raises(ValueError, match="forward_runner must be torch or gil_free, got 'x'"):
        ModelConfig(forward_runner="x")


@pytest.mark.integration
def test_server_with_gil_free_runner_serves_the_package(
    embedding_package_dir: Path, tmp_path: Path
) -> None:
    from harness.server import start_server

    server = start_server(embedding_package_dir, tmp_path, "--forward_runner", "gil_free")
    try:
        tiles = np.random.default_rng(5).integers(0, 256, (4, 224, 224, 3), dtype=np.uint8)
        with HistoserveClient(server.base, server.model_name) as client:
            got = client.infer_pixels(tiles)["embedding"]
    finally:
        assert server.stop() == 0
    (package,) = sorted(embedding_package_dir.glob("*.pt2"))
    (want,) = Reference(package)(normalise_reference(tiles))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
