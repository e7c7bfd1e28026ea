"""Synthetic tiles and their encodings (numpy and Pillow only)."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

import numpy as np
from PIL import Image


def random_tiles(n: int, size: int = 224, seed: int = 0) -> np.ndarray:
    """``uint8 [n, size, size, 3]`` uniform noise tiles, each clearly different from the others."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)


def encode_png(tile: np.ndarray) -> bytes:
    """One ``uint8 [H, W, 3]`` tile as PNG bytes."""
    buf = io.BytesIO()
    Image.fromarray(tile).save(buf, format="PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    """Base64 text of ``data`` (how JSON carries ``BYTES``)."""
    return base64.b64encode(data).decode()


def bytes_array(items: Sequence[bytes]) -> np.ndarray:
    """An object array of raw bytes for a ``BYTES`` input."""
    arr = np.empty(len(items), dtype=np.object_)
    arr[:] = list(items)
    return arr
