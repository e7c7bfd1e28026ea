"""Feature files of every layout for the slide-head tests, written as ``histoserve embed`` writes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from histoserve.results.layouts import Layout
from histoserve.results.output import SlideResult

D = 16
PATCH = 896
TILE_CONFIG = {  # a tile model's config as a fake tile server (harness.bad_server) answers it
    "name": "h0-mini",
    "package_sha256": "cd" * 32,
    "spec": {"name": "h0-mini", "family": "embedding", "tile_size": 224, "mpp": 0.5,
             "modes": ["embedding"], "embedding_dim": D},
    "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, D]}],
}  # fmt: skip  # level-0 px of a 224 px tile at 1 um/px from a 0.25 um/px slide


def attrs(slide_id: str, width: int = 20_000, height: int = 12_000) -> dict:
    """A plan's attributes as embed writes them (1 um/px tiles read at level 1 and resized)."""
    return {
        "target_mpp": 1.0, "level0_mpp": 0.25, "mpp_source": "test", "tile_size": 224,
        "patch_size_level0": PATCH, "read_level": 1, "read_size": 448, "read_downsample": 2.0,
        "read_level_width": width // 2, "read_level_height": height // 2,
        "level0_width": width, "level0_height": height, "slide_backend": "test",
        "slide_id": slide_id, "config_hash": "x" * 64, "model": "h0-mini",
    }  # fmt: skip


def tissue_coords(n: int, seed: int = 0) -> np.ndarray:
    """``n`` tiles on a grid inside an ellipse of tissue, level-0 (x, y), rows by y then x."""
    grid = [
        (x, y) for y in range(0, 12_000 - PATCH, PATCH) for x in range(0, 20_000 - PATCH, PATCH)
    ]
    inside = [(x, y) for x, y in grid if ((x - 9000) / 8000) ** 2 + ((y - 5500) / 5000) ** 2 < 1]
    return np.asarray(inside[:n], np.int64)


def features_for(coords: np.ndarray, seed: int = 0) -> np.ndarray:
    """float32 ``[N, D]``: smooth over the slide (a 'tumour' region top left), plus noise."""
    rng = np.random.default_rng(seed)
    x, y = coords[:, 0] / 20_000, coords[:, 1] / 12_000
    signal = np.exp(-((x - 0.3) ** 2 + (y - 0.35) ** 2) / 0.02)
    base = rng.standard_normal((len(coords), D)) * 0.3
    base[:, :4] += signal[:, None] * 3
    return base.astype(np.float32)


def write(layout: str, out: Path, slide_id: str, features: np.ndarray, coords: np.ndarray) -> Path:
    """Writes one slide's feature files in ``layout`` under ``out``; returns its done file."""
    result = SlideResult(features, None, coords, np.ones(len(coords), np.float32), attrs(slide_id))
    return Layout(layout, out, 1.0, 224, "h0-mini", features.shape[1]).write(slide_id, result)
