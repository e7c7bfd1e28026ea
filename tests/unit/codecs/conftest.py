"""Fixtures shared by the codec tests: real images encoded with PIL."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import pytest
from PIL import Image

from predictor.config import LimitsConfig
from predictor.spec import BUILTIN_SPECS, ModelSpec


def _encode(array: np.ndarray, fmt: str, mode: str | None = None, **save_kwargs) -> bytes:
    img = Image.fromarray(array, mode) if mode else Image.fromarray(array)
    buffer = io.BytesIO()
    img.save(buffer, fmt, **save_kwargs)
    return buffer.getvalue()


@pytest.fixture
def encode() -> Callable[..., bytes]:
    """``encode(array, "PNG")``: the array as encoded image bytes."""
    return _encode


@pytest.fixture
def rgb() -> np.ndarray:
    """A noisy 37x41 RGB tile (noise defeats compression; odd sizes catch transposes)."""
    return np.random.default_rng(0).integers(0, 256, size=(37, 41, 3), dtype=np.uint8)


@pytest.fixture
def limits() -> LimitsConfig:
    return LimitsConfig()


@pytest.fixture
def encoder_spec() -> ModelSpec:
    return BUILTIN_SPECS["h0-mini"]


@pytest.fixture
def multimodal_spec() -> ModelSpec:
    return BUILTIN_SPECS["m-optimus"]
