"""The real-geometry demo ViTs the GPU check exports (issue 28): H0-mini's ViT-B/14 and H-optimus-0's ViT-g/14.

Built at reduced depth here (the full ViT-g holds ~1.1B parameters); the
geometry per block, the pooling, the output width and the LayerScale that
makes every block count are what the GPU's packages get.
"""

from __future__ import annotations

import torch

from predictor.families import build_demo_model
from predictor.families.embedding import PRESETS, ViTConfig
from predictor.spec import BUILTIN_SPECS


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_vit_b_is_h0_mini_geometry() -> None:
    cfg = PRESETS["vit-b"]
    assert (cfg.width, cfg.depth, cfg.heads, cfg.hidden()) == (768, 12, 12, 4096)
    assert (cfg.mlp, cfg.registers, cfg.pool) == ("swiglu", 4, "cls+mean")
    model = build_demo_model(BUILTIN_SPECS["h0-mini"], "vit-b", depth=1)
    block = model.blocks[0]
    assert block.mlp.fc1.out_features == 4096 and block.mlp.fc2.in_features == 2048
    assert model.prefix.shape == (1, 5, 768)  # CLS + 4 registers
    assert isinstance(model.head, torch.nn.Identity)  # CLS + patch mean is 1536 already
    per_block = _params(block)
    assert 7.0e6 < per_block < 7.2e6  # timm's ViT-B/14 SwiGLU block: 7.08M
    out = model(torch.randn(2, 3, 224, 224))
    assert out.shape == (2, 1536)


def test_vit_g_is_h_optimus_0_geometry() -> None:
    cfg = PRESETS["vit-g"]
    assert (cfg.width, cfg.depth, cfg.heads, cfg.hidden()) == (1536, 40, 24, 8192)
    assert (cfg.mlp, cfg.registers, cfg.pool) == ("swiglu", 4, "cls")
    model = build_demo_model(BUILTIN_SPECS["h0"], "vit-g", depth=1)
    assert 2.80e7 < _params(model.blocks[0]) < 2.85e7  # x 40 blocks: ~1.13B parameters
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1536)


def test_layer_scale_lets_every_block_contribute() -> None:
    """Dropping the last block moves the embedding a lot (not LayerScale 1e-5's "barely")."""
    model = build_demo_model(BUILTIN_SPECS["h0-mini"], "vit-b", depth=2, width=96, heads=4)
    x = torch.randn(4, 3, 224, 224)
    with torch.inference_mode():
        full = model(x)
        model.blocks = model.blocks[:1]
        fewer = model(x)
    cosine = torch.nn.functional.cosine_similarity(full, fewer).min()
    assert float(cosine) < 0.99


def test_flops_per_tile() -> None:
    """ViT-B/14 at 224 px is ~2 x 87M parameters x 261 tokens plus attention: ~47 GFLOP."""
    vit_b = PRESETS["vit-b"].flops_per_tile(224, 14)
    vit_g = PRESETS["vit-g"].flops_per_tile(224, 14)
    assert 4.4e10 < vit_b < 5.0e10
    assert 5.8e11 < vit_g < 6.2e11
    small = ViTConfig(width=8, depth=1, heads=2, mlp_ratio=2.0)
    tokens, w = 4 + 1, 8
    want = 2 * (4 * 3 * 14 * 14 * w + tokens * (4 * w * w + 2 * w * 16 + 2 * tokens * w))
    assert small.flops_per_tile(28, 14) == want
