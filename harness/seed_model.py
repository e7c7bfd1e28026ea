"""A model written only from the seed's page (``seed/server_model.md``), as a user would.

It imports the seed's names from the package root, subclasses
``BaseServerModel`` and overrides the two hooks the page documents, each
calling ``super()``: ``prepare_sample`` refuses blank tiles with a
``ValueError`` (the page's HTTP 400) and hands its tile over in the page's
``(C, H, W)`` layout; ``forward_batch`` returns unit-length embeddings.
Served by ``python -m predictor --model_class harness.seed_model:UnitNormEmbedder``.
"""

from __future__ import annotations

import numpy as np

from predictor import BaseServerModel, ModelRequest, ModelResponse, PreparedSample

BLANK_BELOW = 4.0
"""A tile whose mean pixel value is below this is refused as blank."""


class UnitNormEmbedder(BaseServerModel):
    """An embedding backbone whose embeddings are scaled to unit length; blank tiles refused."""

    def prepare_sample(self, request: ModelRequest) -> PreparedSample:
        """The base's decoding and checks, then the blank check; the tile as ``(C, H, W)``.

        Raises:
            ValueError: A blank tile (and whatever the base refuses).
        """
        checked = super().prepare_sample(request)
        pixels = np.asarray(checked.tile)
        if pixels.mean() < BLANK_BELOW:
            raise ValueError(f"blank tile (mean pixel value {pixels.mean():.1f})")
        # The base hands the fast layout (H, W, C) over; the page documents (C, H, W).
        chw = pixels.transpose(2, 0, 1) if pixels.shape[-1] == 3 else pixels
        return PreparedSample(tile=chw, extra_tensors=checked.extra_tensors)

    def forward_batch(
        self,
        samples: list[PreparedSample],
        requests: list[ModelRequest],
        mode: str = "prediction",
    ) -> list[ModelResponse]:
        """The base's forward, each embedding divided by its length."""
        responses = super().forward_batch(samples, requests, mode)
        unit = []
        for response, _request in zip(responses, requests, strict=True):
            embedding = response.outputs["embedding"]
            unit.append(ModelResponse({"embedding": embedding / np.linalg.norm(embedding)}))
        return unit
