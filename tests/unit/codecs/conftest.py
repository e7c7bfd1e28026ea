"""Fixtures shared by the codec tests: real images encoded with PIL."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
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


def _run_triton_grpc(script: str, payload: str = "") -> str:
    """Runs ``script`` with tritonclient.grpc in a fresh interpreter (no kserve)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        input=payload,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="session")
def triton_grpc() -> Callable[[str, str], str]:
    """``triton_grpc(script, stdin) -> stdout`` in a subprocess.

    tritonclient.grpc and kserve register the same protobuf symbols
    (``inference.*`` in the default descriptor pool), so importing both in one
    process fails: the outside gRPC client must run in its own interpreter.
    """
    return _run_triton_grpc
