"""The request parameter ``mode``: its values and the outputs each one asks for, declared once.

Both sides read these: the server's specs accept only these modes
(:mod:`predictor.spec`) and the client checks every answer for the outputs
its mode asks (:mod:`histoserve.remote.answers`, :mod:`histoserve.heads.head`).
Which table applies to a served model is read off what its config declares
(a ``features`` input: a slide head; a ``mask`` output: a tissue model), never
off its family's name.
"""

from __future__ import annotations

from collections.abc import Mapping

MODES = ("embedding", "prediction", "prediction_with_embedding")
"""Modes of a tile model (the ``embedding``, ``multimodal`` and ``segmentation`` families)."""

SLIDE_MODES = ("prediction", "embedding", "attention")
"""Modes of a slide head (the ``slide`` family); a request may also join several with commas."""

MODE_OUTPUTS: Mapping[str, tuple[str, ...]] = {
    "embedding": ("embedding",),
    "prediction": ("prediction",),
    "prediction_with_embedding": ("prediction", "embedding"),
}
"""The outputs each tile mode asks for (a tissue model answers :data:`MASK_OUTPUTS` instead)."""

SLIDE_MODE_OUTPUTS: Mapping[str, tuple[str, ...]] = {
    "prediction": ("prediction",),
    "attention": ("attention",),
    "embedding": ("slide_embedding",),
}
"""The output each slide-head mode asks for."""

MASK_OUTPUTS = ("mask",)
"""What a tissue model answers, whatever its mode: one ``UINT8`` mask per tile."""

SLIDE_INPUT = "features"
"""The input that makes a model a slide head: one slide's tile features."""
