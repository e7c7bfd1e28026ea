"""The exporter proves a package before renaming it into place: a fresh-process load and one batch.

A package that compiles may still not load (a native crash in its
constructors or constants upload, a missing symbol) or may not compute what
the module computes (Python state baked in at trace time, a lowering bug).
:class:`Verifier` runs on the staged file: it loads it in a fresh
``python -m predictor.runtime.load_child`` with its own deadline
(:func:`predictor.runtime.load_probe.probe_load`: a signal or a hang there kills
the child, not the exporter), runs the export's example batch through it
there, and compares the outputs with the eager module's on the same batch.
Any failure raises :class:`~predictor.errors.CheckpointError` naming the stage
(``load-in-fresh-process`` or ``compare``); the exporter then removes the
staged file, so nothing is written.

Tolerances (:data:`TOLERANCES`), per floating-point output, relative to the
output's scale ``max(1, max |eager|)``: fp32 ``1e-3``, fp16 ``2e-2``, bf16
``5e-2`` (bf16 keeps 8 bits of mantissa; eager rounds after every op where
inductor's fused kernels keep fp32 between them). Non-finite values must
sit where the eager module has them; integer outputs must be equal.
``--compare_tolerance`` overrides the dtype's value.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from predictor.errors import CheckpointError
from predictor.packages.metadata import read_metadata
from predictor.runtime.load_probe import probe_load

TOLERANCES = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 5e-2}
"""Largest ``max |package - eager|`` per output, as a share of ``max(1, max |eager|)``."""
LOAD_TIMEOUT_S = 300.0
"""The fresh-process load's default deadline (``--load_timeout_s``), ``import torch`` included."""


def add_verify_flags(parser: argparse.ArgumentParser) -> None:
    """The export CLI's verification flags (``--load_timeout_s``, ``--compare_tolerance``)."""
    parser.add_argument(
        "--load_timeout_s",
        type=float,
        default=LOAD_TIMEOUT_S,
        help="deadline of the written package's load and batch in a fresh process",
    )
    parser.add_argument(
        "--compare_tolerance",
        type=float,
        default=None,
        help="largest package-vs-eager difference, as a share of the output's scale "
        "(default: fp32 1e-3, fp16 2e-2, bf16 5e-2)",
    )


@dataclass(frozen=True)
class Verifier:
    """Checks a staged package against the eager module's outputs on ``inputs``.

    Attributes:
        inputs: The batch the eager module ran (on its device).
        eager: The eager module's flat outputs for ``inputs``.
        dtype: ``fp32``, ``fp16`` or ``bf16``: picks the tolerance.
        device: Where the package runs (``cpu``, ``cuda:N``).
        timeout_s: The fresh-process load's deadline.
        tolerance: Overrides the dtype's tolerance when set.
    """

    inputs: tuple[torch.Tensor, ...]
    eager: tuple[torch.Tensor, ...]
    dtype: str
    device: str
    timeout_s: float = LOAD_TIMEOUT_S
    tolerance: float | None = None

    def __call__(self, staged: Path) -> None:
        """Loads ``staged`` in a fresh process, runs the batch, compares.

        Raises:
            CheckpointError: ``stage load-in-fresh-process: ...`` or ``stage compare: ...``.
        """
        inputs_file = staged.with_name("verify-inputs.pt")
        outputs_file = staged.with_name("verify-outputs.pt")
        torch.save(tuple(t.detach().cpu() for t in self.inputs), inputs_file)
        try:
            probe_load(
                staged, self.device, read_metadata(staged), runner="auto",
                timeout_s=self.timeout_s, exchange=(inputs_file, outputs_file),
                what="stage load-in-fresh-process", off_hint=None,
            )  # fmt: skip
        except CheckpointError as exc:
            raise CheckpointError(f"{exc} The package was not written.") from exc
        package = tuple(torch.load(outputs_file, weights_only=True))
        problems = compare(self.eager, package, self.limit)
        if problems:
            raise CheckpointError(
                f"stage compare: the package's outputs differ from the eager module's on the "
                f"same batch ({self.dtype}, tolerance {self.limit:g} of each output's scale): "
                f"{'; '.join(problems)}. The package was not written. What to do: a forward "
                f"that depends on Python state or on the batch's values (branches, counters, "
                f"randomness) is baked in when traced; make it a function of its inputs, or "
                f"pass --compare_tolerance if the difference is only rounding"
            )

    @property
    def limit(self) -> float:
        """The tolerance in force: the override, else the dtype's."""
        return self.tolerance if self.tolerance is not None else TOLERANCES[self.dtype]


def compare(
    eager: Sequence[torch.Tensor], package: Sequence[torch.Tensor], tolerance: float
) -> list[str]:
    """What differs between the eager and the package outputs (empty: they agree).

    A package's output may be padded along the batch axis (more rows, the
    same row shape); it is trimmed to the eager one's rows first.
    """
    if len(package) != len(eager):
        return [f"{len(package)} outputs, the eager module has {len(eager)}"]
    problems = []
    for i, (want, got) in enumerate(zip(eager, package, strict=True)):
        want = want.detach().cpu()
        padded = got.dim() == want.dim() >= 1 and got.shape[1:] == want.shape[1:]
        if padded and got.shape[0] > want.shape[0]:
            got = got[: want.shape[0]]
        if got.shape != want.shape:
            problems.append(f"output {i} has shape {list(got.shape)}, eager {list(want.shape)}")
        elif not want.is_floating_point():
            if not torch.equal(got, want):
                problems.append(f"output {i} ({want.dtype}) is not equal")
        else:
            problems += _float_problems(i, want.float(), got.float(), tolerance)
    return problems


def _float_problems(i: int, want: torch.Tensor, got: torch.Tensor, tolerance: float) -> list[str]:
    finite = torch.isfinite(want)
    if not torch.equal(finite, torch.isfinite(got)):
        return [f"output {i} is non-finite where the eager module's is not (or the reverse)"]
    if not bool(finite.any()):
        return []
    scale = max(1.0, float(want[finite].abs().max()))
    diff = float((got[finite] - want[finite]).abs().max())
    if diff > tolerance * scale:
        return [f"output {i}: max |package - eager| = {diff:.3g} > {tolerance:g} x {scale:.3g}"]
    return []
