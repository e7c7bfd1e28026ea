"""Tissue segmentation (``tissue-seg``): a binary tissue mask per tile.

512x512 tiles, plain ``/255`` (the spec gives no mean/std). The package
returns logits ``[B', 1, H, W]`` or ``[B', H, W]``; packages that pad their
output to a fixed batch (``B' > B``) are trimmed to the real batch. The mask
(``sigmoid > threshold``) is computed on the device and copied back as
``uint8``, a quarter of the float32 bytes. The demo model is
:class:`predictor.pt2.demo_models.DemoSegmenter`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from predictor.codecs.samples import ModelResponse
from predictor.device.normalizer import to_host
from predictor.errors import SpecError, SpecMismatch
from predictor.model.family import OutputSpec
from predictor.model.tiles import TileFamily
from predictor.pt2.demo_models import SEGMENTER_CHANNELS, DemoSegmenter
from predictor.spec import ModelSpec


class SegmentationFamily(TileFamily):
    """A tissue segmenter: V2 ``mask`` ``UINT8 [N, H, W]``, V1 flattened ``output``."""

    PACKAGE_OUTPUTS: ClassVar[tuple[str, ...]] = ("logits",)

    @classmethod
    def check_outputs(
        cls, spec: ModelSpec, shapes: Sequence[tuple[int, ...]], prediction_dim: int | None
    ) -> None:
        size = spec.tile_size
        if shapes[0] not in ((1, size, size), (size, size)):
            raise SpecMismatch(
                f"spec {spec.name!r} says masks are {size}x{size} ([1, {size}, {size}] logits) "
                f"but the package returns {list(shapes[0])}"
            )

    @classmethod
    def build_demo(cls, spec: ModelSpec, preset: str, opts: dict[str, Any]) -> nn.Module:
        if preset not in SEGMENTER_CHANNELS:
            raise SpecError(
                f"unknown demo preset {preset!r}; expected one of {sorted(SEGMENTER_CHANNELS)}"
            )
        channels = int(opts.pop("channels", SEGMENTER_CHANNELS[preset]))
        return DemoSegmenter(channels, pad_to_batch=opts.pop("pad_to_batch", None))

    def output_to_host(self, output: torch.Tensor) -> torch.Tensor:
        logits = output.squeeze(1) if output.dim() == 4 else output
        threshold = self.spec.mask_threshold
        # sigmoid(x) > t  <=>  x > logit(t): no sigmoid over every pixel.
        cut = math.log(threshold / (1.0 - threshold))
        return to_host((logits > cut).to(torch.uint8))  # queued: read after the turn

    def build_responses(self, outputs: Sequence[np.ndarray], mode: str) -> list[ModelResponse]:
        return [ModelResponse({"mask": mask}) for mask in outputs[0]]

    def outputs(self, mode: str | None = None) -> tuple[OutputSpec, ...]:
        """One ``mask`` ``UINT8 [-1, T, T]`` whatever the mode."""
        size = self.spec.tile_size
        return (OutputSpec("mask", "UINT8", (-1, size, size)),)

    def metadata(self) -> Mapping[str, Any]:
        return {"mask_threshold": self.spec.mask_threshold}


FAMILY = SegmentationFamily
"""The ``segmentation`` family's hooks (the registry: :func:`predictor.families.family_for`)."""
