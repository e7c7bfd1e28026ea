"""The GPU check's packages, exported on the machine that runs them, and its real H&E crops.

A ``.pt2`` is tied to the torch that exported it, so ``make gpu-check``
exports everything where it runs: the tiny demo ViT (``h0-mini`` geometry) in
fp32 and bf16, the bf16 demos of ``m-optimus`` and ``tissue-seg``, and, where
timm is importable, the real ``h0-mini`` architecture (timm's
``vit_base_patch14_reg4_dinov2``, SwiGLU, 224 px, CLS + mean of the patch
tokens) with random weights (:func:`h0_mini_random`) in fp32 and bf16; with
``--vit_g`` also the H-optimus-0 geometry (ViT-g/14, bf16). Each export runs
in its own process, all at once (:func:`export_all`), through
:mod:`harness.packages`' cache (``HISTOSERVE_TEST_PACKAGE_CACHE``), so a
second run reuses them. ``python -m bench.gpu_packages NAME DEVICE`` exports
one and prints its path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
H0_MINI_FACTORY = "bench.gpu_packages:h0_mini_random"

# name: (spec, source, options); source "demo:PRESET" or "module:TARGET".
PACKAGES: dict[str, tuple[str, str, dict[str, str]]] = {
    "tiny-fp32": ("h0-mini", "demo:tiny", {}),
    "tiny-bf16": ("h0-mini", "demo:tiny", {"dtype": "bf16"}),
    "m-optimus-bf16": ("m-optimus", "demo:tiny", {"dtype": "bf16"}),
    "tissue-seg-bf16": ("tissue-seg", "demo:tiny", {"dtype": "bf16"}),
    "h0-mini-fp32": ("h0-mini", f"module:{H0_MINI_FACTORY}", {}),
    "h0-mini-bf16": ("h0-mini", f"module:{H0_MINI_FACTORY}", {"dtype": "bf16"}),
    "vit-g-bf16": ("h0", "demo:vit-g", {"dtype": "bf16", "max_batch": "64"}),
}
"""Every package the check knows; which it exports depends on timm and ``--vit_g``."""


def h0_mini_random() -> Any:
    """H0-mini's architecture through timm with random weights (seeded: fp32 and bf16 agree)."""
    import timm
    import torch

    from predictor.export.sources import _ClsMeanPool

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_base_patch14_reg4_dinov2",
        pretrained=False,
        num_classes=0,
        img_size=224,
        mlp_layer=timm.layers.SwiGLUPacked,
        act_layer=torch.nn.SiLU,
    )
    return _ClsMeanPool(model, int(model.num_prefix_tokens)).eval()


def export_one(name: str, device: str) -> Path:
    """The cached package ``name`` exported for ``device`` (``cpu`` or ``cuda``)."""
    from harness.packages import demo_package, module_package

    spec, source, opts = PACKAGES[name]
    opts = dict(opts, device=device) if device != "cpu" else dict(opts)
    kind, _, target = source.partition(":")
    if kind == "demo":
        return demo_package(spec, target, **opts)
    flags = [item for key, value in sorted(opts.items()) for item in (f"--{key}", value)]
    return module_package(spec, target, *flags)


def export_all(names: list[str], device: str, timeout_s: float) -> dict[str, Any]:
    """Exports ``names`` in parallel processes; name to path, or to the error."""
    started = time.monotonic()
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "bench.gpu_packages", name, device],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONWARNINGS="ignore"),
        )
        for name in names
    }
    out: dict[str, Any] = {}
    for name, proc in procs.items():
        left = max(1.0, timeout_s - (time.monotonic() - started))
        try:
            stdout, stderr = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            out[name] = {"error": f"export took over {timeout_s:.0f} s"}
            continue
        lines = stdout.strip().splitlines()
        if proc.returncode == 0 and lines:
            out[name] = Path(lines[-1])
        else:
            out[name] = {"error": (stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return out


def he_crops(n: int, size: int = 224) -> np.ndarray:
    """``n`` crops of real H&E (``wsidicom-data``'s 240x240 tile, Apache-2.0), ``uint8 [n, size, size, 3]``.

    The tile is mirrored into a seamless 480x480 block and cropped at
    different offsets, flips and rotations. Read from ``.gpu-wheels/he_tile.png``
    when present (a machine without ``wsidicom-data``; ``make wheelhouse``
    copies it there), else from the installed package.
    """
    from PIL import Image

    local = REPO / ".gpu-wheels" / "he_tile.png"
    if local.is_file():
        with Image.open(local) as image:
            tile = np.asarray(image.convert("RGB"))
    else:
        from harness.slides import he_tile

        tile = he_tile()
    top = np.concatenate([tile, tile[:, ::-1]], axis=1)
    block = np.concatenate([top, top[::-1]], axis=0)
    reps = -(-(size + 32) // block.shape[0])  # seamless, so it tiles for larger crops
    block = np.tile(block, (reps, reps, 1))
    rng = np.random.default_rng(0)
    crops = np.empty((n, size, size, 3), dtype=np.uint8)
    for i in range(n):
        y, x = rng.integers(0, block.shape[0] - size, 2)
        crop = np.rot90(block[y : y + size, x : x + size], k=i % 4)
        crops[i] = crop[:, ::-1] if (i // 4) % 2 else crop
    return crops


if __name__ == "__main__":
    print(export_one(sys.argv[1], sys.argv[2]))
