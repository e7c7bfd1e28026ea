"""Small decoding helpers shared by the V1 and V2 codecs.

All raise :class:`~predictor.errors.InvalidInput` without a location; callers
add the input and tile with ``.at(...)``.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from predictor.codecs.images import check_encoded_size
from predictor.config import LimitsConfig
from predictor.errors import InvalidInput


def decode_base64(text: Any, *, limits: LimitsConfig) -> bytes:
    """Strictly decodes one base64 image string.

    Strict means the standard alphabet with padding and nothing else (no
    whitespace, no ``data:`` prefix, no URL-safe alphabet): a lenient decoder
    silently drops stray characters and turns typos into corrupt images. The
    length is checked before decoding so an oversized string costs nothing.

    Args:
        text: The value the client sent.
        limits: ``max_image_bytes`` bounds the decoded size.

    Returns:
        The decoded bytes.

    Raises:
        InvalidInput: ``text`` is not a string, is empty, too long, or not
            valid base64.
    """
    if not isinstance(text, str):
        raise InvalidInput(f"expected a base64 string, got {type(text).__name__}")
    if not text:
        raise InvalidInput("empty image data")
    max_chars = 4 * math.ceil(limits.max_image_bytes / 3)
    if len(text) > max_chars:
        raise InvalidInput(
            f"base64 image is {len(text)} characters, more than the "
            f"{max_chars} that {limits.max_image_bytes} bytes take"
        )
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"invalid base64 ({exc}): starts {text[:16]!r}") from exc
    check_encoded_size(len(data), limits=limits)
    return data


def string_parameter(params: Mapping[str, Any], name: str) -> str | None:
    """A request parameter that must be a string when present."""
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(
            f"parameter '{name}' must be a string, got {type(value).__name__} {value!r:.40}"
        )
    return value


MAX_COUNT = 2**64 - 1


def count_parameter(params: Mapping[str, Any], name: str, *, unit: str = "") -> int | None:
    """A request parameter that must be a whole number from 0 to 2**64 - 1 when present
    (``priority``, ``timeout``: gRPC carries them as 64-bit integers, so REST's JSON is
    held to the same range)."""
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        shown = str(value) if isinstance(value, int) else repr(value)
        what = f"{type(value).__name__} {shown[:40]}"
        raise InvalidInput(
            f"parameter '{name}' must be a whole number from 0 to 2**64 - 1{unit}, got {what}"
        )
    return value


def bool_parameter(params: Mapping[str, Any], name: str, *, default: bool = False) -> bool:
    """A request parameter that must be a JSON boolean when present."""
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidInput(
            f"parameter '{name}' must be a boolean, got {type(value).__name__} {value!r:.40}"
        )
    return value


def first_non_finite(values: np.ndarray) -> int | None:
    """Index along the first axis of the first entry (or row) holding NaN or inf.

    The one finiteness check of bulk RNA (V1 and V2 decoding, the multimodal
    family's own validation), vectorised.

    Returns:
        The index, or ``None`` when every value is finite.
    """
    bad = ~np.isfinite(values)
    if bad.ndim > 1:
        bad = bad.reshape(bad.shape[0], -1).any(axis=1)
    hits = np.flatnonzero(bad)
    return int(hits[0]) if hits.size else None
