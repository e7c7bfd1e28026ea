"""The exporter proves a package before writing it: fresh-process load, one batch against eager.

A module whose compiled form differs from its eager form is exported for real
(its forward counts its calls in Python state, so the traced graph bakes in a
count the eager call did not see: the class of bug the comparison exists for);
the export fails at the ``compare`` stage and leaves nothing at its output. A
real package whose shared library segfaults on load fails the
``load-in-fresh-process`` stage, and the exporter survives it. The comparison's
rules (per dtype tolerance, non-finite positions, padding) are checked on
tensors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from harness.native_crash import misbehaving_model_dir
from predictor.errors import CheckpointError
from predictor.export import build as export
from predictor.export.verify import TOLERANCES, Verifier, compare
from predictor.spec import BUILTIN_SPECS


class CallCountingEncoder(nn.Module):
    """An encoder whose output is scaled by how many times ``forward`` ran (Python state).

    Eagerly, the exporter's reference call is the first (x1); tracing runs it
    again, and the package keeps the count it saw then (x2 or more).
    """

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(3, 1536)
        self.calls = 0

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.proj(tiles.mean(dim=(2, 3))) * float(self.calls)


def test_a_package_that_differs_from_eager_is_not_written(tmp_path: Path) -> None:
    spec = BUILTIN_SPECS["h0-mini"]
    output = tmp_path / "out" / "h0-mini.pt2"
    with pytest.raises(CheckpointError) as caught:
        export.export_package(
            CallCountingEncoder(),
            spec,
            output,
            example_inputs=(torch.randn(2, 3, 224, 224),),
            min_batch=2,
            max_batch=2,
        )
    message = str(caught.value)
    assert message.startswith("stage compare:") and "max |package - eager|" in message
    assert "not written" in message
    assert sorted(p.name for p in output.parent.iterdir()) == []  # no package, digest or staging


def test_a_package_that_crashes_on_load_fails_the_fresh_process_stage(
    embedding_package_dir: Path, tmp_path: Path
) -> None:
    crashing = misbehaving_model_dir(embedding_package_dir, "segv", tmp_path / "segv")
    staged = crashing / "h0-mini.pt2"
    inputs = (torch.zeros(2, 3, 224, 224),)
    verify = Verifier(inputs, (torch.zeros(2, 1536),), "fp32", "cpu", timeout_s=60)
    with pytest.raises(CheckpointError) as caught:
        verify(staged)  # the exporter (this process) lives on
    message = str(caught.value)
    assert message.startswith("stage load-in-fresh-process:") and "signal SIGSEGV" in message
    assert str(staged) in message and "--load_probe" not in message


def test_a_good_package_passes(embedding_package_dir: Path) -> None:
    from predictor.runtime.loader import load_package

    path = embedding_package_dir / "h0-mini.pt2"
    inputs = (torch.randn(2, 3, 224, 224),)
    (eager,) = load_package(path, torch.device("cpu"))(*inputs)  # the package stands in for eager
    Verifier(inputs, (eager[:2].clone(),), "fp32", "cpu", timeout_s=120)(path)
    with pytest.raises(CheckpointError, match="stage compare"):
        Verifier(inputs, (eager[:2] + 1.0,), "fp32", "cpu", timeout_s=120)(path)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_the_tolerance_is_the_dtypes_share_of_the_output_scale(dtype: str) -> None:
    eager = torch.tensor([[4.0, -2.0, 0.5]])
    tol = TOLERANCES[dtype]
    assert compare([eager], [eager + 0.9 * tol * 4.0], tol) == []
    (problem,) = compare([eager], [eager + 1.1 * tol * 4.0], tol)
    assert problem.startswith("output 0: max |package - eager|")
    assert TOLERANCES["fp32"] < TOLERANCES["fp16"] < TOLERANCES["bf16"]


def test_the_comparison_rules() -> None:
    eager = torch.tensor([[1.0, float("nan")], [0.0, 2.0]])
    padded = torch.cat([eager, torch.full((2, 2), 7.0)])  # a package padding the batch axis
    assert compare([eager], [padded], 1e-3) == []
    moved = torch.tensor([[float("nan"), 1.0], [0.0, 2.0]])
    assert "non-finite" in compare([eager], [moved], 1e-3)[0]
    assert "shape" in compare([eager], [torch.zeros(2, 3)], 1e-3)[0]
    assert "2 outputs" in compare([eager], [eager, eager], 1e-3)[0]
    ints = torch.tensor([[1, 2]])
    assert compare([ints], [ints.clone()], 1e-3) == []
    assert "not equal" in compare([ints], [ints + 1], 1e-3)[0]
