"""Embedding backbones (``h0-mini``, ``h0``, ``h1``): a tile in, one ``embedding [D]`` out.

The family: its hooks are the tile family's defaults
(:class:`~predictor.model.tiles.TileFamily`), its one mode ``embedding``
(:data:`histoserve.wire.MODE_OUTPUTS`), no spec section of its own, and its
demo model, a ViT/14 without timm or torchvision: a
:class:`DemoViT` with ``spec.prefix_tokens`` prefix tokens whose embedding
is the CLS token concatenated with the mean of the patch tokens (H0-mini
style; ``pool="cls"``: CLS alone, H-optimus-0), projected to
``spec.embedding_dim``. The presets (:data:`PRESETS`) size it: ``tiny``
(fast to compile), ``vit-s``, and the real geometries ``vit-b`` (H0-mini)
and ``vit-g`` (H-optimus-0) for benchmarks. The multimodal family's demo
reuses it for the tile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from histoserve.wire import MODE_OUTPUTS
from predictor.errors import SpecError
from predictor.model.tiles import TileFamily
from predictor.spec import ModelSpec


class EmbeddingFamily(TileFamily):
    """An embedding backbone: the tile hooks as they are, its mode and its demo ViT."""

    MODE_OUTPUTS: ClassVar[Mapping[str, tuple[str, ...]]] = {"embedding": MODE_OUTPUTS["embedding"]}

    @classmethod
    def build_demo(cls, spec: ModelSpec, preset: str, opts: dict[str, Any]) -> nn.Module:
        """A random-weight ViT/14 (:func:`vit_for`)."""
        return vit_for(spec, preset, opts)


FAMILY = EmbeddingFamily
"""The ``embedding`` family's hooks (the registry: :func:`predictor.families.family_for`)."""


# -- the demo model ---------------------------------------------------------------------


@dataclass(frozen=True)
class ViTConfig:
    """ViT geometry of a demo preset.

    Attributes:
        width: Token width (embed dim).
        depth: Number of transformer blocks.
        heads: Attention heads (must divide ``width``).
        mlp_ratio: Hidden width of the MLP over ``width`` (timm's meaning:
            for SwiGLU the packed ``fc1`` width, half of it reaches ``fc2``).
        mlp: ``gelu`` (Linear, GELU, Linear) or ``swiglu`` (timm's
            ``SwiGLUPacked``: ``silu(a) * b`` of ``fc1``'s two halves).
        registers: Register tokens after CLS (DINOv2 ``reg4``), excluded
            from the patch mean.
        layer_scale: LayerScale's initial value on each block's two branches
            (``None``: no LayerScale). Random weights with a large value make
            every block change the output, so fidelity checks exercise them.
        pool: ``cls+mean`` (CLS then the patch-token mean, H0-mini) or
            ``cls`` (CLS only, H-optimus-0).
    """

    width: int
    depth: int
    heads: int
    mlp_ratio: float = 4.0
    mlp: str = "gelu"
    registers: int = 0
    layer_scale: float | None = None
    pool: str = "cls+mean"

    def hidden(self) -> int:
        """The MLP's hidden width (``fc1``'s output), as timm sizes it."""
        return int(self.width * self.mlp_ratio)

    def flops_per_tile(self, tile_size: int, patch_size: int, prefix_tokens: int = 1) -> float:
        """Floating-point operations (2 per multiply-add) of one tile's forward.

        The patch embedding, every block's matmuls (QKV, attention scores and
        values, projection, MLP) and the head; norms, softmax and activations
        are left out (a few per cent).
        """
        patches = (tile_size // patch_size) ** 2
        tokens = patches + max(prefix_tokens, 1) + self.registers
        w, hidden = self.width, self.hidden()
        fc2_in = hidden // 2 if self.mlp == "swiglu" else hidden
        per_token = 4 * w * w + w * hidden + fc2_in * w + 2 * tokens * w
        embed = patches * 3 * patch_size * patch_size * w
        return 2.0 * (embed + self.depth * tokens * per_token)


REAL_LAYER_SCALE = 0.5
"""LayerScale of the real-geometry presets: large enough that every block counts."""

PRESETS: Mapping[str, ViTConfig] = {
    "tiny": ViTConfig(width=96, depth=2, heads=4),
    "vit-s": ViTConfig(width=384, depth=12, heads=6),
    # H0-mini: ViT-B/14, 4 registers, SwiGLU, CLS + patch mean = 1536 out.
    "vit-b": ViTConfig(
        width=768, depth=12, heads=12, mlp_ratio=5.33334, mlp="swiglu", registers=4,
        layer_scale=REAL_LAYER_SCALE,
    ),
    # H-optimus-0: ViT-g/14, 4 registers, SwiGLU, CLS = 1536 out (~1.1B parameters).
    "vit-g": ViTConfig(
        width=1536, depth=40, heads=24, mlp_ratio=5.33334, mlp="swiglu", registers=4,
        layer_scale=REAL_LAYER_SCALE, pool="cls",
    ),
}  # fmt: skip


class _SwiGLU(nn.Module):
    """timm's ``SwiGLUPacked``: ``fc2(silu(a) * b)`` where ``a, b`` are ``fc1``'s two halves."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden // 2, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(F.silu(a) * b)


class _LayerScale(nn.Module):
    """A learned per-channel scale on a residual branch (DINOv2's LayerScale)."""

    def __init__(self, width: int, value: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((width,), value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


def _mlp(cfg: ViTConfig) -> nn.Module:
    if cfg.mlp == "swiglu":
        return _SwiGLU(cfg.width, cfg.hidden())
    if cfg.mlp != "gelu":
        raise SpecError(f"unknown ViT mlp {cfg.mlp!r}; expected gelu or swiglu")
    return nn.Sequential(
        nn.Linear(cfg.width, cfg.hidden()), nn.GELU(), nn.Linear(cfg.hidden(), cfg.width)
    )


class _Block(nn.Module):
    """Pre-norm transformer block (attention + MLP), each branch LayerScaled when configured."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.width)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.norm2 = nn.LayerNorm(cfg.width)
        self.mlp = _mlp(cfg)
        scaled = cfg.layer_scale is not None
        self.ls1 = _LayerScale(cfg.width, cfg.layer_scale) if scaled else nn.Identity()
        self.ls2 = _LayerScale(cfg.width, cfg.layer_scale) if scaled else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.ls1(self.proj(attn.transpose(1, 2).reshape(b, n, c)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class DemoViT(nn.Module):
    """ViT/14 tile encoder: ``[B, 3, T, T]`` normalised float -> ``[B, out_dim]``.

    The output is CLS concatenated with the mean of the patch tokens (register
    tokens excluded; ``cfg.pool == "cls"``: CLS alone), then a linear
    projection to ``out_dim`` when the pooled width differs from it.
    """

    def __init__(
        self, cfg: ViTConfig, *, tile_size: int, patch_size: int, prefix_tokens: int, out_dim: int
    ):
        super().__init__()
        if cfg.width % cfg.heads:
            raise SpecError(f"ViT width {cfg.width} is not divisible by heads {cfg.heads}")
        if tile_size % patch_size:
            raise SpecError(f"tile_size {tile_size} is not a multiple of patch_size {patch_size}")
        if cfg.pool not in ("cls", "cls+mean"):
            raise SpecError(f"unknown ViT pool {cfg.pool!r}; expected cls or cls+mean")
        self.pool = cfg.pool
        self.prefix_tokens = max(prefix_tokens, 1) + cfg.registers
        n_patches = (tile_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(3, cfg.width, patch_size, stride=patch_size)
        self.prefix = nn.Parameter(torch.randn(1, self.prefix_tokens, cfg.width) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, n_patches, cfg.width) * 0.02)
        self.blocks = nn.Sequential(*(_Block(cfg) for _ in range(cfg.depth)))
        self.norm = nn.LayerNorm(cfg.width)
        pooled = cfg.width if cfg.pool == "cls" else 2 * cfg.width
        self.head = nn.Identity() if pooled == out_dim else nn.Linear(pooled, out_dim)

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(tiles).flatten(2).transpose(1, 2) + self.pos_embed
        x = torch.cat([self.prefix.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.norm(self.blocks(x))
        if self.pool == "cls":
            return self.head(x[:, 0])
        pooled = torch.cat([x[:, 0], x[:, self.prefix_tokens :].mean(dim=1)], dim=-1)
        return self.head(pooled)


def _vit_config(preset: str, opts: dict[str, Any]) -> ViTConfig:
    if preset not in PRESETS:
        raise SpecError(f"unknown demo preset {preset!r}; expected one of {sorted(PRESETS)}")
    keys = ("width", "depth", "heads", "mlp_ratio", "mlp", "registers", "layer_scale", "pool")
    overrides = {k: opts.pop(k) for k in keys if k in opts}
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
