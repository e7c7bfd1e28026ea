"""Random-weight demo models with each spec's exact input and output geometry.

The vendor's weights are gated, so every spec must still be exercisable end to
end: these small ``nn.Module``s take and return exactly what the real packages
do (first input the normalised float tile batch, first output the primary
output), without timm or torchvision. They are what ``histoserve export
--demo`` compiles and what the test suite serves. Which module a spec gets is
its family's choice (``build_demo`` in :mod:`predictor.families`;
:func:`predictor.families.build_demo_model` is the entry point).

Modules:

- ``embedding`` (h0-mini, h0, h1): a ViT/14 with ``spec.prefix_tokens`` prefix
  tokens; the embedding is the CLS token concatenated with the mean of the
  patch tokens (H0-mini style), projected to ``spec.embedding_dim``.
- ``multimodal`` (m-optimus): the same ViT for the tile, plus a bulk RNA branch;
  returns ``(prediction [B, K] in log space, embedding [B, D])``. ``NaN`` bulk
  RNA values (a row of NaN: "no bulk RNA for this tile") are replaced by a
  learned default vector inside the graph, so the package keeps exactly two
  inputs.
- ``segmentation`` (tissue-seg): a tiny conv net, logits ``[B, 1, T, T]``;
  ``pad_to_batch`` pads the output batch axis like some vendor packages do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from predictor.errors import SpecError
from predictor.spec import ModelSpec

DEMO_GENES_IN = 64
DEMO_GENES_OUT = 32


@dataclass(frozen=True)
class ViTConfig:
    """ViT geometry of a demo preset.

    Attributes:
        width: Token width (embed dim).
        depth: Number of transformer blocks.
        heads: Attention heads (must divide ``width``).
        mlp_ratio: Hidden width of the MLP over ``width``.
    """

    width: int
    depth: int
    heads: int
    mlp_ratio: float = 4.0


PRESETS: Mapping[str, ViTConfig] = {
    "tiny": ViTConfig(width=96, depth=2, heads=4),
    "vit-s": ViTConfig(width=384, depth=12, heads=6),
    "vit-g": ViTConfig(width=1536, depth=40, heads=24),
}

SEGMENTER_CHANNELS: Mapping[str, int] = {"tiny": 8, "vit-s": 16, "vit-g": 32}
"""Segmentation presets only scale the conv width."""


class _Block(nn.Module):
    """Pre-norm transformer block (attention + GELU MLP)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.width)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.norm2 = nn.LayerNorm(cfg.width)
        hidden = int(cfg.width * cfg.mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.width, hidden), nn.GELU(), nn.Linear(hidden, cfg.width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, n, c))
        return x + self.mlp(self.norm2(x))


class DemoViT(nn.Module):
    """ViT/14 tile encoder: ``[B, 3, T, T]`` normalised float -> ``[B, out_dim]``.

    The output is CLS concatenated with the mean of the patch tokens (register
    tokens excluded), then a linear projection to ``out_dim`` when ``2 * width``
    differs from it.
    """

    def __init__(
        self, cfg: ViTConfig, *, tile_size: int, patch_size: int, prefix_tokens: int, out_dim: int
    ):
        super().__init__()
        if cfg.width % cfg.heads:
            raise SpecError(f"ViT width {cfg.width} is not divisible by heads {cfg.heads}")
        if tile_size % patch_size:
            raise SpecError(f"tile_size {tile_size} is not a multiple of patch_size {patch_size}")
        self.prefix_tokens = max(prefix_tokens, 1)
        n_patches = (tile_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(3, cfg.width, patch_size, stride=patch_size)
        self.prefix = nn.Parameter(torch.randn(1, self.prefix_tokens, cfg.width) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, n_patches, cfg.width) * 0.02)
        self.blocks = nn.Sequential(*(_Block(cfg) for _ in range(cfg.depth)))
        self.norm = nn.LayerNorm(cfg.width)
        pooled = 2 * cfg.width
        self.head = nn.Identity() if pooled == out_dim else nn.Linear(pooled, out_dim)

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(tiles).flatten(2).transpose(1, 2) + self.pos_embed
        x = torch.cat([self.prefix.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.norm(self.blocks(x))
        pooled = torch.cat([x[:, 0], x[:, self.prefix_tokens :].mean(dim=1)], dim=-1)
        return self.head(pooled)


class DemoMultimodal(nn.Module):
    """Tile + bulk RNA model: ``(tiles, bulk_rna)`` -> ``(prediction, embedding)``.

    ``bulk_rna`` is ``[B, G]`` float32, already ``log1p``-transformed; ``NaN``
    entries (a whole ``NaN`` row means "no bulk RNA") take the learned default.
    ``prediction`` is ``[B, K]`` in log space (non-negative, so the runtime's
    ``expm1`` gives non-negative expression); ``embedding`` is ``[B, D]``.
    """

    def __init__(self, vit: DemoViT, *, genes_in: int, genes_out: int, embedding_dim: int):
        super().__init__()
        self.genes_in = genes_in
        self.genes_out = genes_out
        self.vit = vit
        self.default_rna = nn.Parameter(torch.rand(genes_in) * 2.0)
        self.rna = nn.Sequential(nn.Linear(genes_in, 128), nn.GELU(), nn.Linear(128, 128))
        self.predict = nn.Linear(embedding_dim + 128, genes_out)

    def forward(
        self, tiles: torch.Tensor, bulk_rna: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        embedding = self.vit(tiles)
        dtype = self.default_rna.dtype
        rna = bulk_rna.to(dtype)
        rna = torch.where(torch.isnan(rna), self.default_rna.expand_as(rna), rna)
        fused = torch.cat([embedding, self.rna(rna)], dim=-1)
        prediction = F.softplus(self.predict(fused))
        return prediction, embedding


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


def _vit_config(preset: str, opts: dict[str, Any]) -> ViTConfig:
    if preset not in PRESETS:
        raise SpecError(f"unknown demo preset {preset!r}; expected one of {sorted(PRESETS)}")
    overrides = {k: opts.pop(k) for k in ("width", "depth", "heads", "mlp_ratio") if k in opts}
    return replace(PRESETS[preset], **overrides)


def vit_for(spec: ModelSpec, preset: str, opts: dict[str, Any]) -> DemoViT:
    """A demo ViT for ``spec``'s tiles; pops the ViT options it uses from ``opts``."""
    return DemoViT(
        _vit_config(preset, opts),
        tile_size=spec.tile_size,
        patch_size=spec.patch_size or 14,
        prefix_tokens=spec.prefix_tokens,
        out_dim=opts.pop("embedding_dim", spec.embedding_dim),
    )
