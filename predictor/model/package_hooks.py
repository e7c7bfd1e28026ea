"""What a model's packages look like: :class:`PackageFamily`, the class-level hooks.

Export, the demo models and the start-up check ask a model class (never an
instance, no server needed) which inputs and outputs its packages record,
how to build its random-weight demo module, example inputs, and whether a
package's probed per-tile output shapes fit a spec. The defaults are the
embedding backbone's (one ``embedding [D]`` per tile); a family overrides
them (:mod:`predictor.families`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from predictor.errors import SpecMismatch
from predictor.pt2.demo_models import vit_for
from predictor.pt2.probe import format_shapes
from predictor.spec import ModelSpec


class PackageFamily:
    """Class-level hooks: a family's package names, demo module, example inputs, output check."""

    PACKAGE_INPUTS: ClassVar[tuple[str, ...]] = ("tiles",)
    """Input names recorded in the family's packages, tiles first."""
    PACKAGE_OUTPUTS: ClassVar[tuple[str, ...]] = ("embedding",)
    """Output names recorded in the family's packages, primary first."""

    CROSSES_PROCESSES: ClassVar[bool] = True
    """Whether ``--frontends > 1`` can serve it (fixed-size shared-memory slots per tile)."""
    DEFAULT_MAX_BATCH: ClassVar[int] = 256
    """``histoserve export``'s default upper bound of the packages' dynamic axis."""

    @classmethod
    def package_outputs(cls, spec: ModelSpec) -> tuple[str, ...]:
        """Output names ``spec``'s packages record, primary first (default: ``PACKAGE_OUTPUTS``)."""
        return cls.PACKAGE_OUTPUTS

    @classmethod
    def recorded_shape(cls, name: str, shape: Sequence[int]) -> list[int]:
        """How package metadata records a tensor's shape: ``-1`` for the batch axis."""
        return [-1, *shape[1:]]

    @classmethod
    def check_outputs(
        cls, spec: ModelSpec, shapes: Sequence[tuple[int, ...]], prediction_dim: int | None
    ) -> None:
        """Checks the probed per-tile output shapes against ``spec`` (default: one embedding).

        Raises:
            SpecMismatch: One line naming the spec, the expectation and the package's value.
        """
        check_embedding_shape(spec, shapes[0])

    @classmethod
    def build_demo(cls, spec: ModelSpec, preset: str, opts: dict[str, Any]) -> nn.Module:
        """The random-weight demo module (default: a ViT/14); pops the options it uses from ``opts``."""
        return vit_for(spec, preset, opts)

    @classmethod
    def example_inputs(
        cls, spec: ModelSpec, batch: int, *, genes_in: int, seed: int
    ) -> tuple[torch.Tensor, ...]:
        """Example package inputs for export and tests: normalised float tiles first."""
        gen = torch.Generator().manual_seed(seed)
        size = spec.tile_size
        return (torch.randn(batch, 3, size, size, generator=gen),)


def check_shapes(
    family: type[PackageFamily],
    spec: ModelSpec,
    shapes: Sequence[Sequence[int]],
    prediction_dim: int | None = None,
) -> None:
    """Checks probed per-tile output shapes: their count, then the family's own rule.

    Raises:
        SpecMismatch: One line naming the spec, the expectation and the package's value.
    """
    expected = len(family.PACKAGE_OUTPUTS)
    if len(shapes) != expected:
        raise SpecMismatch(
            f"spec {spec.name!r} ({spec.family}) expects {expected} output(s) but the package "
            f"returns {len(shapes)}: {format_shapes(shapes)}"
        )
    family.check_outputs(spec, [tuple(s) for s in shapes], prediction_dim)


def check_embedding_shape(spec: ModelSpec, shape: tuple[int, ...]) -> None:
    """A per-tile embedding must be ``[spec.embedding_dim]`` (shared with multimodal).

    Raises:
        SpecMismatch: Not a vector, or of another width.
    """
    if len(shape) != 1:
        raise SpecMismatch(
            f"spec {spec.name!r} expects a per-tile embedding vector but the package returns shape {list(shape)}"
        )
    if shape[0] != spec.embedding_dim:
        raise SpecMismatch(
            f"spec {spec.name!r} says embedding_dim {spec.embedding_dim} but the package returns {shape[0]}"
        )
