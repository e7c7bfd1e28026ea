"""torch's loader called flat (:class:`TorchRunner`) and the model copies a CUDA package gets (issue 38).

The real tiny demo package on the CPU; torch's loader is replaced by a
recorder only where a GPU would be needed (the copies asked for on CUDA).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import torch
from torch.export.pt2_archive._package import AOTICompiledModel

from harness.packages import demo_package
from predictor.device.pipeline import LANES
from predictor.runtime import runners
from predictor.runtime.loader import load_package
from predictor.runtime.runners import CUDA_COPIES_PER_INSTANCE, TorchRunner, as_torch_runner


class CountingLoader:
    """torch's loader, counting how often the call spec is asked for."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.spec_reads = 0

    def get_call_spec(self) -> list[str]:
        self.spec_reads += 1
        return self.inner.get_call_spec()

    def boxed_run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.inner.boxed_run(inputs)

    def get_metadata(self) -> dict[str, str]:
        return self.inner.get_metadata()


def test_the_torch_runner_reads_the_call_spec_once_and_answers_as_torchs_wrapper() -> None:
    package = load_package(demo_package("h0-mini"), torch.device("cpu"), runner="torch")
    assert isinstance(package.runner, TorchRunner) and package.forward_runner == "torch"
    loader = CountingLoader(package.runner.loader)
    runner = TorchRunner(loader)
    x = torch.randn(3, 3, 224, 224)
    with torch.inference_mode():
        for _ in range(3):
            (got,) = runner(x)
        want = AOTICompiledModel(package.runner.loader)(x)
    assert loader.spec_reads == 1  # at load, never per call
    assert torch.equal(got, want)
    assert package(x)[0].shape == (3, 1536)
    with pytest.raises(ValueError, match="takes 1 inputs, got 2"):
        runner(x, x)


class SpecOnly:
    """A loader whose call spec is the test's (a package with keyword or nested outputs)."""

    def __init__(self, out_spec: Any) -> None:
        self.out_spec = out_spec

    def get_call_spec(self) -> list[str]:
        flat_in = torch.utils._pytree.tree_flatten(((torch.zeros(1),), {}))[1]
        out = torch.utils._pytree.tree_flatten(self.out_spec)[1]
        return [torch.utils._pytree.treespec_dumps(s) for s in (flat_in, out)]


def test_a_package_with_nested_outputs_keeps_torchs_wrapper() -> None:
    nested = {"a": torch.zeros(1), "b": (torch.zeros(1),)}
    assert isinstance(as_torch_runner(SpecOnly(nested)), AOTICompiledModel)
    assert isinstance(as_torch_runner(SpecOnly((torch.zeros(1), torch.zeros(1)))), TorchRunner)
    json.loads(SpecOnly(torch.zeros(1)).get_call_spec()[1])  # the spec is torch's own format


@pytest.mark.parametrize(("device", "instances", "copies"), [("cuda:1", 1, 2), ("cuda:0", 3, 6)])
def test_a_cuda_package_gets_one_model_copy_per_lane(
    monkeypatch: pytest.MonkeyPatch, caplog: Any, device: str, instances: int, copies: int
) -> None:
    asked: list[tuple[int, int]] = []

    class Recorder:
        def __init__(self, path: str, model: str, single: bool, n: int, index: int) -> None:
            asked.append((n, index))

        def get_call_spec(self) -> list[str]:
            return SpecOnly(torch.zeros(1)).get_call_spec()

    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", Recorder)
    with caplog.at_level(logging.INFO, logger="histoserve"):
        runner = runners.load_kind(
            demo_package("h0-mini"), torch.device(device), "torch", instances
        )
    loaded = f"on {device}: loaded by torch's AOTI loader (torch {torch.__version__}), {copies}"
    assert loaded in caplog.text  # the loader path and versions, at INFO
    assert isinstance(runner, TorchRunner)
    assert asked == [(copies, torch.device(device).index)]
    assert CUDA_COPIES_PER_INSTANCE == LANES  # one copy per pipelined lane
