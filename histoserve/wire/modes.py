"""The request parameter ``mode``: each kind of model's modes and the outputs each asks for.

Declared once, as data, and read by both sides: each server family references
its table (its ``MODE_OUTPUTS``, :mod:`predictor.families`; a spec may list
only its family's modes), and the client checks every answer for the outputs
its mode asks (:mod:`histoserve.remote.answers`, :mod:`histoserve.heads.head`).
Which table applies to a served model is read off what its config declares
(a ``features`` input: a slide head; a ``mask`` output: a tissue model), never
off its family's name. ``tests/unit/families/test_declarations.py`` fails a
copy of these tables anywhere else.
"""

from __future__ import annotations

from collections.abc import Mapping

MODE_OUTPUTS: Mapping[str, tuple[str, ...]] = {
    "embedding": ("embedding",),
    "prediction": ("prediction",),
    "prediction_with_embedding": ("prediction", "embedding"),
}
"""The outputs each mode of a tile model asks for (a tissue model answers :data:`MASK_OUTPUTS` instead)."""

MODES = tuple(MODE_OUTPUTS)
"""Modes of a tile model (``histoserve embed --mode``)."""

SLIDE_OUTPUTS = ("prediction", "attention", "slide_embedding")
"""What a slide head answers, in the order its package returns them (``prediction`` only with classes)."""

SLIDE_MODE_OUTPUTS: Mapping[str, tuple[str, ...]] = {
    "prediction": (SLIDE_OUTPUTS[0],),
    "embedding": (SLIDE_OUTPUTS[2],),
    "attention": (SLIDE_OUTPUTS[1],),
}
"""The output each slide-head mode asks for; a request may also join several modes with commas."""

SLIDE_MODES = tuple(SLIDE_MODE_OUTPUTS)
"""Modes of a slide head."""

MASK_OUTPUTS = ("mask",)
"""What a tissue model answers, whatever its mode: one ``UINT8`` mask per tile."""

SLIDE_INPUT = "features"
"""The input that makes a model a slide head: one slide's tile features."""
