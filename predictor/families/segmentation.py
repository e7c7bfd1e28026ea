"""Tissue segmentation (``tissue-seg``): a binary tissue mask per tile.

512x512 tiles, plain ``/255`` (the spec gives no mean/std). The package
returns logits ``[B', 1, H, W]`` or ``[B', H, W]``; packages that pad their
output to a fixed batch (``B' > B``) are trimmed to the real batch. The mask
(``sigmoid > threshold``) is computed on the device and copied back as
``uint8``, a quarter of the float32 bytes.

Every tile mode answers the mask (:data:`histoserve.wire.MASK_OUTPUTS`);
the family's spec section is its ``mask_threshold``. Its demo model is
:class:`DemoSegmenter`, a tiny conv net.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from histoserve.wire import MASK_OUTPUTS, MODES
from predictor.codecs.samples import ModelResponse
from predictor.device.normalizer import to_host
from predictor.errors import SpecError, SpecMismatch
from predictor.model.family import OutputSpec
from predictor.model.tiles import TileFamily
from predictor.spec import ModelSpec


class SegmentationFamily(TileFamily):
    """A tissue segmenter: V2 ``mask`` ``UINT8 [N, H, W]``, V1 flattened ``output``."""

    MODE_OUTPUTS: ClassVar[Mapping[str, tuple[str, ...]]] = dict.fromkeys(MODES, MASK_OUTPUTS)
    SPEC_FIELDS: ClassVar[tuple[str, ...]] = ("mask_threshold",)
    PACKAGE_OUTPUTS: ClassVar[tuple[str, ...]] = ("logits",)

    @classmethod
    def check_spec(cls, spec: ModelSpec) -> None:
        """The tile modes, and a mask threshold strictly between 0 and 1."""
        super().check_spec(spec)
        if not 0.0 < spec.mask_threshold < 1.0:
            raise SpecError(
                f"spec {spec.name!r}: mask_threshold must be between 0 and 1 (exclusive), "
                f"got {spec.mask_threshold!r}"
            )

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
        (name,) = MASK_OUTPUTS
        return [ModelResponse({name: mask}) for mask in outputs[0]]

    def outputs(self, mode: str | None = None) -> tuple[OutputSpec, ...]:
        """One ``mask`` ``UINT8 [-1, T, T]`` whatever the mode."""
        size = self.spec.tile_size
        return tuple(OutputSpec(name, "UINT8", (-1, size, size)) for name in MASK_OUTPUTS)

    def metadata(self) -> Mapping[str, Any]:
        return {"mask_threshold": self.spec.mask_threshold}


FAMILY = SegmentationFamily
"""The ``segmentation`` family's hooks (the registry: :func:`predictor.families.family_for`)."""


# -- the demo model ---------------------------------------------------------------------

SEGMENTER_CHANNELS: Mapping[str, int] = {"tiny": 8, "vit-s": 16, "vit-g": 32}
"""Segmentation presets only scale the conv width."""


class DemoSegmenter(nn.Module):
    """Tiny conv net: ``[B, 3, T, T]`` (plain ``/255``) -> logits ``[B, 1, T, T]``.

    With ``pad_to_batch`` set, the output batch axis is zero-padded to that
    fixed size (as some vendor packages do), so the runtime must trim it.
    """

    def __init__(self, channels: int = 8, pad_to_batch: int | None = None):
        super().__init__()
        if pad_to_batch is not None and pad_to_batch < 1:
            raise SpecError(f"pad_to_batch must be >= 1, got {pad_to_batch}")
        self.pad_to_batch = pad_to_batch
        self.net = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, 1, 1),
        )

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        logits = self.net(tiles)
        if self.pad_to_batch is None:
            return logits
        # slice_scatter, not cat with a [P - B, ...] block: a tensor sized P - B
        # makes torch.export specialise on it and reject the dynamic batch.
        padded = logits.new_zeros((self.pad_to_batch, *logits.shape[1:]))
        return torch.slice_scatter(padded, logits, dim=0, start=0, end=logits.shape[0])
