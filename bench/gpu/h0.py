"""The GPU check's H-optimus-0 stage: the path a user takes, from ``histoserve export --timm`` to served answers.

The package is :func:`bench.gpu.packages.export_timm`'s (``h0-timm-bf16``:
asked with ``--packages``; not on the dry run, where timm does not import).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench.gpu.stages import Context, direct, infer, servers
from bench.gpu.timing import _limit
from bench.load.payloads import he_crops


def h0_user_path(ctx: Context) -> dict[str, Any]:
    """H-optimus-0 as a user exports it (``histoserve export --spec h0 --timm ... --weights``), served.

    The package (:func:`bench.gpu.packages.export_timm`: random weights of
    the geometry, saved by timm there) is served and its answers on 16 H&E
    crops compared with the package run directly (bf16: to the last bit);
    then 4 requests of 64 tiles are timed (one client, serial: a floor) against
    the package's own forward in this process.
    """
    name = "h0-timm-bf16"
    path = ctx.require(name)
    tiles = he_crops(16)
    with servers(ctx, {name: path}) as running:
        served = infer(running[name], {"pixels": tiles})["embedding"]
        batch = he_crops(64)
        started = time.monotonic()
        for _ in range(4):
            infer(running[name], {"pixels": batch})
        tiles_per_s = 4 * len(batch) / (time.monotonic() - started)
    (own,) = direct(path, ctx.first, tiles)
    alone = _limit(ctx, path)  # the package's own forward at ctx.batch, in this process
    diff = float(np.abs(served - own).max())
    finite = bool(np.isfinite(served).all())
    return {
        "package": path.name,
        "embedding": list(served.shape),
        "max_abs_diff": diff,
        "finite": finite,
        "served_tiles_per_s_64": tiles_per_s,
        "in_process_tiles_per_s": alone["tiles_per_s"],
        "served_over_in_process": tiles_per_s / alone["tiles_per_s"],
        "ok": diff == 0.0 and finite and served.shape == (16, 1536),
    }
