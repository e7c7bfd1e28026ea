"""Embedding backbones (``h0-mini``, ``h0``, ``h1``): one ``embedding`` per tile.

224x224 tiles normalised with the vendor's mean/std; the package returns
``[B, D]`` and each tile gets its row, ``FP32 [D]``. Its demo model is a
ViT/14 with the spec's prefix tokens (:class:`predictor.package.demo_models.DemoViT`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from torch import nn

from predictor.codecs.samples import ModelResponse
from predictor.errors import SpecMismatch
from predictor.families.base import TileServerModel
from predictor.package.demo_models import vit_for
from predictor.spec import ModelSpec


class EmbeddingServerModel(TileServerModel):
    """Serves a tile encoder: V2 ``embedding`` ``FP32 [N, D]``, V1 ``output``."""

    PACKAGE_OUTPUTS: ClassVar[tuple[str, ...]] = ("embedding",)

    @classmethod
    def check_outputs(
        cls, spec: ModelSpec, shapes: Sequence[tuple[int, ...]], prediction_dim: int | None
    ) -> None:
        check_embedding_shape(spec, shapes[0])

    @classmethod
    def build_demo(cls, spec: ModelSpec, preset: str, opts: dict[str, Any]) -> nn.Module:
        return vit_for(spec, preset, opts)

    def build_responses(self, outputs: Sequence[np.ndarray], mode: str) -> list[ModelResponse]:
        embeddings = outputs[0]
        return [ModelResponse({"embedding": row}) for row in embeddings]

    def output_names(self, mode: str) -> tuple[str, ...]:
        return ("embedding",)

    def output_datatypes(self) -> Mapping[str, str]:
        return {"embedding": "FP32"}

    def output_shapes(self) -> Mapping[str, list[int]]:
        return {"embedding": [-1, self.model_spec.embedding_dim]}


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
