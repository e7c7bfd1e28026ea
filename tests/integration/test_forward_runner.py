"""``--forward_runner``: ``gil_free`` (the package through its C ABI with the GIL
released), ``torch``, and the default ``auto`` (``gil_free`` on the CPU, torch's
loader where it cannot serve a package, and on a GPU).

Real demo packages; outputs compared with torch's loader bit for bit, and a
real server started with the flag answers with the in-process embeddings.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.packages import demo_package, proxy_executor_package
from harness.reference import Reference, normalise_reference
from histoserve import HistoserveClient
from predictor.cli import build_parser, configs_from_args
from predictor.config import ModelConfig
from predictor.errors import CheckpointError
from predictor.runtime.aoti_runner import GilFreeRunner
from predictor.runtime.loader import _load_runner, load_package

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
    assert build_parser().parse_args([]).forward_runner == "auto"
    assert ModelConfig().forward_runner == "auto"
    with pytest.raises(ValueError, match="forward_runner must be auto, torch or gil_free, got 'x'"):
        ModelConfig(forward_runner="x")


def test_auto_is_the_gil_free_runner_on_the_cpu(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="histoserve"):
        package = load_package(demo_package("h0-mini"), CPU, runner="auto")
    assert isinstance(package.runner, GilFreeRunner) and package.forward_runner == "gil_free"
    assert package.runner.private_inputs  # the server owns its batch tensors
    assert not [r for r in caplog.records if "forward runner" in r.getMessage()]


def test_auto_falls_back_to_torchs_loader_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real proxy-executor package: the runner refuses it, torch's loader serves it."""
    path = proxy_executor_package()
    with caplog.at_level(logging.INFO, logger="histoserve"):
        package = load_package(path, CPU, runner="auto")
    lines = [r.getMessage() for r in caplog.records if "forward runner" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "needs a proxy executor" in lines[0] and "using torch's loader" in lines[0]
    assert package.forward_runner == "torch"
    (out,) = package(torch.ones(2, 16))
    assert out.shape == (2, 8)
    with pytest.raises(CheckpointError, match="needs a proxy executor"):
        load_package(path, CPU, runner="gil_free")  # asked for by name: no fallback


def test_auto_keeps_torchs_loader_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: torch's loader is replaced by a recorder to see which path auto takes."""
    calls: list[tuple[str, int]] = []

    class Recorder:
        def __init__(self, path: str, model: str, check: bool, instances: int, index: int):
            calls.append((model, index))

    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", Recorder)
    runner = _load_runner(demo_package("h0-mini"), torch.device("cuda:1"), "auto")
    assert calls == [("model", 1)] and not isinstance(runner, GilFreeRunner)


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
