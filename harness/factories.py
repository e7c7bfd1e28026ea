"""``histoserve export --module`` factories that several test modules build packages from.

A factory named by ``pkg.mod:factory`` must live in an importable module; the
ones shared by more than one test module live here, so no test imports
another test module for them. :func:`harness.packages.module_package` keys its
cache by the target and the factory's source text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

    from predictor.spec import ModelSpec

WRONG_DIM_TARGET = "harness.factories:wrong_dim_encoder"


def wrong_dim_encoder(spec: ModelSpec) -> nn.Module:
    """An encoder that returns 768 floats whatever the spec says (a spec mismatch)."""
    from predictor.families import build_demo_model

    return build_demo_model(spec, embedding_dim=768, seed=7)
