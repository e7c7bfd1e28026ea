"""``TileServerModel``: what every family shares, and the hooks each one fills in.

Every family takes a square RGB tile first, normalised on the device, and
runs one package forward per batch. A family module
(:mod:`~predictor.families.embedding`, :mod:`~predictor.families.multimodal`,
:mod:`~predictor.families.segmentation`) subclasses this class and owns,
in one place, everything that differs:

* serving: inputs beyond the tile (:meth:`prepare_sample`,
  :meth:`batch_inputs`), reading outputs back (:meth:`output_to_host`,
  :meth:`build_responses`), what a mode returns (:meth:`output_names`,
  :meth:`output_datatypes`, :meth:`output_shapes`, :meth:`input_descriptions`);
* start-up: :meth:`check_package` / :meth:`check_outputs` (the probed
  output shapes against the spec);
* export: ``PACKAGE_INPUTS`` / ``PACKAGE_OUTPUTS`` (the names recorded in a
  package) and :meth:`build_demo` (the random-weight demo model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from predictor.codecs.images import decode_tile
from predictor.codecs.samples import ModelRequest, ModelResponse, PreparedSample
from predictor.device.normalizer import Normalizer, synchronize
from predictor.errors import InvalidInput, SpecMismatch
from predictor.package.loader import LoadedPackage
from predictor.package.probe import format_shapes, probe_outputs
from predictor.serving.model import BaseServerModel
from predictor.spec import ModelSpec


class TileServerModel(BaseServerModel):
    """A :class:`~predictor.serving.model.BaseServerModel` that serves tiles; families subclass it."""

    PACKAGE_INPUTS: ClassVar[tuple[str, ...]] = ("tiles",)
    """Input names recorded in the family's packages, tiles first."""
    PACKAGE_OUTPUTS: ClassVar[tuple[str, ...]] = ()
    """Output names recorded in the family's packages, primary first."""

    _normalizer: Normalizer | None = None

    # -- export and start-up (class level: no server needed) -------------------------------
    @classmethod
    def check_outputs(
        cls, spec: ModelSpec, shapes: Sequence[tuple[int, ...]], prediction_dim: int | None
    ) -> None:
        """Checks the probed per-tile output shapes against ``spec``.

        Raises:
            SpecMismatch: One line naming the spec, the expectation and the package's value.
        """
        raise NotImplementedError

    @classmethod
    def build_demo(cls, spec: ModelSpec, preset: str, opts: dict[str, Any]) -> nn.Module:
        """The family's random-weight demo module; pops the options it uses from ``opts``."""
        raise NotImplementedError

    @classmethod
    def example_inputs(
        cls, spec: ModelSpec, batch: int, *, genes_in: int, seed: int
    ) -> tuple[torch.Tensor, ...]:
        """Example package inputs for export and tests: normalised float tiles first."""
        gen = torch.Generator().manual_seed(seed)
        size = spec.tile_size
        return (torch.randn(batch, 3, size, size, generator=gen),)

    def check_package(self, package: LoadedPackage) -> list[tuple[int, ...]]:
        """Probes the package on the spec's inputs, checks its outputs, binds the normaliser.

        Returns:
            The probed per-tile output shapes, primary first.

        Raises:
            SpecMismatch: The package disagrees with the spec.
        """
        shapes, self._normalizer = self.bind_device(package)
        return shapes

    def bind_device(self, package: LoadedPackage) -> tuple[list[tuple[int, ...]], Normalizer]:
        """Probes one device's package and builds that device's normaliser.

        Called once per loaded package (one per GPU under ``--device auto``),
        so every device is probed before the pod turns ready.

        Raises:
            SpecMismatch: The package disagrees with the spec.
        """
        probed = probe_outputs(package, self.model_spec, self.extra_input_shapes(package))
        shapes = [tuple(s) for s in probed]
        check_shapes(type(self), self.model_spec, shapes)
        return shapes, Normalizer(self.model_spec, package.device, package.input_dtype)

    def extra_input_shapes(self, package: LoadedPackage) -> Mapping[str, int]:
        """Per-tile sizes of inputs after the tiles (none by default)."""
        return {}

    # -- stage 1 --------------------------------------------------------------------------
    def prepare_sample(self, request: ModelRequest) -> PreparedSample:
        """Decodes and validates one tile; ``InvalidInput`` becomes a 400.

        Called in the stage-1 thread pool. The tile stays ``uint8 [H, W, 3]``
        (see :mod:`predictor.codecs.samples` for why HWC); normalisation happens on
        the device, in the batch.
        """
        pixels = request.pixels
        if pixels is None:
            if request.image_data is None:
                raise InvalidInput("no image data")
            pixels = decode_tile(request.image_data, limits=self._options.limits)
        size = self.model_spec.tile_size
        if pixels.dtype != np.uint8 or pixels.shape != (size, size, 3):
            raise InvalidInput(
                f"expected a {size}x{size} RGB uint8 tile, got shape {tuple(pixels.shape)} {pixels.dtype}"
            )
        return PreparedSample(tile=pixels)

    # -- stage 2 --------------------------------------------------------------------------
    @torch.inference_mode()
    def forward_batch(self, samples: list[PreparedSample], mode: str) -> list[ModelResponse]:
        """Runs one batch on the device: one response per sample, positionally aligned.

        Stacks, moves to the device, normalises there, runs the package,
        synchronises, copies back. Any failure propagates as raised: the
        batcher classifies it and wraps it once
        (:func:`predictor.errors.forward_failure`) for the whole batch.
        """
        if self._fault_hook is not None:
            self._fault_hook.check([s.tile for s in samples])
        package = self.active_slot().package
        outputs = package(*self.batch_inputs(samples))
        host = [self.output_to_host(out[: len(samples)]) for out in outputs]
        synchronize(package.device)
        return self.build_responses([t.numpy() for t in host], mode)

    def batch_inputs(self, samples: Sequence[PreparedSample]) -> tuple[torch.Tensor, ...]:
        """The package's inputs for a batch, on the device (tiles first)."""
        return (self.active_slot().normalizer([s.tile for s in samples]),)

    def output_to_host(self, output: torch.Tensor) -> torch.Tensor:
        """Device output (trimmed to the real batch) to a host tensor; fp32 by default."""
        return output.float().cpu() if output.is_floating_point() else output.cpu()

    def build_responses(self, outputs: Sequence[np.ndarray], mode: str) -> list[ModelResponse]:
        """One response per sample from the host outputs (views, no copies)."""
        raise NotImplementedError

    # -- description ----------------------------------------------------------------------
    def output_names(self, mode: str) -> tuple[str, ...]:
        """Output tensor names a mode returns, primary first."""
        raise NotImplementedError

    def output_datatypes(self) -> Mapping[str, str]:
        """V2 datatype of every output the model can return."""
        raise NotImplementedError

    def output_shapes(self) -> Mapping[str, list[int]]:
        """V2 shape of every output (``-1`` for the batch axis)."""
        raise NotImplementedError

    def input_descriptions(self) -> list[dict[str, Any]]:
        """V2 metadata of the inputs a request may carry."""
        size = self.model_spec.tile_size
        return [
            {"name": "tiles", "datatype": "BYTES", "shape": [-1]},
            {"name": "pixels", "datatype": "UINT8", "shape": [-1, size, size, 3]},
        ]

    def get_input_types(self) -> list[dict[str, Any]]:
        return self.input_descriptions()

    def get_output_types(self) -> list[dict[str, Any]]:
        types = self.output_datatypes()
        return [
            {"name": n, "datatype": types[n], "shape": s} for n, s in self.output_shapes().items()
        ]

    def warm_up(self, package: LoadedPackage) -> None:
        """Runs before the first request; nothing yet beyond the probe's two forwards."""


def check_shapes(
    family: type[TileServerModel],
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
