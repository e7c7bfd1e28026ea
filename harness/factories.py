"""``histoserve export --module`` factories that several test modules build packages from.

A factory named by ``pkg.mod:factory`` must live in an importable module; the
ones shared by more than one test module live here, so no test imports
another test module for them. :func:`harness.packages.module_package` keys its
cache by the target and the factory's source text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from predictor.spec import ModelSpec

WRONG_DIM_TARGET = "harness.factories:wrong_dim_encoder"


def wrong_dim_encoder(spec: ModelSpec) -> nn.Module:
    """An encoder that returns 768 floats whatever the spec says (a spec mismatch)."""
    from predictor.families import build_demo_model

    return build_demo_model(spec, embedding_dim=768, seed=7)


BLANK_OVERFLOW_TARGET = "harness.factories:blank_overflow_model"


def blank_overflow_model(spec: ModelSpec) -> nn.Module:
    """A tile model whose outputs overflow to infinity on a blank (all-white) tile only.

    What an FP16 package does on a tile far from its training range, made
    deterministic: every row is finite except a blank tile's (every
    normalised value above ``0.97 * white``), whose outputs are divided by
    zero. Zero tiles (the start-up probe's) are finite. By the spec's family:
    ``embedding [B, D]`` (the channel means through a fixed projection);
    ``segmentation`` logits ``[B, 1, T, T]`` (saturated pixels are tissue);
    ``multimodal`` ``(prediction [B, 4], embedding [B, D])`` from tiles and
    ``bulk_rna [B, 8]`` (a NaN entry counts as 0; the values are cast to the
    model's dtype, as a vendor's would, so an FP16 package overflows on a
    value beyond 65504).
    """
    import torch
    from torch import nn

    mean = torch.tensor(spec.mean or (0.0, 0.0, 0.0))
    std = torch.tensor(spec.std or (1.0, 1.0, 1.0))
    white = float(((1.0 - mean) / std).min())
    family, dim = spec.family, spec.embedding_dim

    class BlankOverflow(nn.Module):
        genes_in = 8

        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Parameter(torch.linspace(-1.0, 1.0, 3 * dim).reshape(3, dim))
            self.rna = nn.Parameter(torch.linspace(0.1, 1.0, 8 * 4).reshape(8, 4))

        def forward(self, x: torch.Tensor, bulk_rna: torch.Tensor | None = None) -> Any:
            blank = (x.amin(dim=(1, 2, 3)) > 0.97 * white).to(x.dtype)
            scale = 1.0 / (1.0 - blank)  # infinity for a blank tile
            if family == "segmentation":
                spread = x.amax(dim=1, keepdim=True) - x.amin(dim=1, keepdim=True)
                return 40.0 * (spread - 0.08) * scale[:, None, None, None]
            embedding = (x.mean(dim=(2, 3)) @ self.proj) * scale[:, None]
            if family != "multimodal":
                return embedding
            assert bulk_rna is not None
            rna = torch.nan_to_num(bulk_rna.to(x.dtype), nan=0.0)
            prediction = nn.functional.softplus(rna @ self.rna) * scale[:, None]
            return prediction, embedding

    return BlankOverflow().eval()


WEIGHTS_TARGET = "harness.factories:untrained_encoder"


def untrained_encoder(spec: ModelSpec) -> nn.Module:
    """The tiny demo encoder's architecture with throw-away weights: ``--weights`` gives the real ones.

    What a lab's ``--module`` factory is: code for the architecture; the weights
    arrive as a file (:func:`harness.package_sets.write_weights`).
    """
    from predictor.families import build_demo_model

    return build_demo_model(spec, seed=99)
