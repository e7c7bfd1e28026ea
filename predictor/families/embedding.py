"""Embedding backbones (``h0-mini``, ``h0``, ``h1``): a tile in, one ``embedding [D]`` out.

Their hooks are the tile family's defaults
(:class:`~predictor.model.tiles.TileFamily`): the model layer's own, since
the seed's ``BaseServerModel`` serves an embedding backbone with no family
named. This module is that family's row of the registry.
"""

from __future__ import annotations

from predictor.model.tiles import TileFamily

FAMILY = TileFamily
"""The ``embedding`` family's hooks (the registry: :func:`predictor.families.family_for`)."""
