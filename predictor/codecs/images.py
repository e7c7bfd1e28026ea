"""Encoded tile bytes (PNG, JPEG, TIFF) to ``uint8 [H, W, 3]`` RGB arrays.

Decoding is the one place where client bytes meet a C library, so it is
defensive: sizes are checked before anything is decoded (the encoded length
first, then the width and height the header declares), only three formats are
tried, and every failure, whatever PIL raises, becomes
:class:`~predictor.errors.InvalidInput`.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from predictor.config import LimitsConfig
from predictor.errors import InvalidInput

FORMATS = ("PNG", "JPEG", "TIFF")
"""Formats :func:`decode_tile` accepts (PIL plugin names)."""

_WHITE = (255, 255, 255)
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


def check_encoded_size(size: int, *, limits: LimitsConfig) -> None:
    """Refuses an encoded image by its length alone.

    Shared with the request codecs so an oversized tile fails its whole
    request before any other tile is decoded.

    Raises:
        InvalidInput: ``size`` is 0 or above ``limits.max_image_bytes``.
    """
    if size == 0:
        raise InvalidInput("empty image data")
    if size > limits.max_image_bytes:
        raise InvalidInput(
            f"encoded image is {size} bytes, more than the limit of {limits.max_image_bytes}"
        )


def decode_tile(data: bytes, *, limits: LimitsConfig) -> np.ndarray:
    """Decodes one encoded tile to an RGB array.

    The header is read lazily and the declared size checked against
    ``limits.max_image_pixels`` before the pixel data is decoded, so a
    decompression bomb costs a few hundred bytes of parsing. Grayscale, palette
    and CMYK images are converted to RGB; alpha is composited over white (the
    slide background); 16-bit grayscale keeps its 8 most significant bits.
    Only the first frame of a multi-page TIFF is read.

    Args:
        data: The encoded image (PNG, JPEG or TIFF), base64 already removed.
        limits: Size limits (``max_image_bytes``, ``max_image_pixels``).

    Returns:
        ``uint8 [H, W, 3]`` C-contiguous array; it may be read-only.

    Raises:
        InvalidInput: Empty, oversized, unknown format, declared size over the
            limit, truncated or corrupt data, or an unsupported pixel mode. The
            error has no location: the caller adds one with ``.at(...)``.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidInput(f"image data must be bytes, got {type(data).__name__}")
    check_encoded_size(len(data), limits=limits)
    try:
        with _open(data) as img:
            _check_declared_size(img, limits)
            _load(img)
            return _to_rgb(img)
    except InvalidInput:
        raise
    except Exception as exc:  # PIL raises many types; none may escape
        raise InvalidInput(f"cannot decode image: {type(exc).__name__}: {exc}") from exc


def _open(data: bytes) -> Image.Image:
    """Reads the header only (PIL opens lazily)."""
    try:
        return Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError as exc:
        raise InvalidInput(f"not a {', '.join(FORMATS)} image") from exc
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InvalidInput(f"image too large (decompression bomb): {exc}") from exc
    except Exception as exc:
        raise InvalidInput(f"unreadable image header: {type(exc).__name__}: {exc}") from exc


def _check_declared_size(img: Image.Image, limits: LimitsConfig) -> None:
    width, height = img.size
    if width <= 0 or height <= 0:
        raise InvalidInput(f"image declares an empty size {width}x{height}")
    if width * height > limits.max_image_pixels:
        raise InvalidInput(
            f"image declares {width}x{height} = {width * height} pixels, more than the "
            f"limit of {limits.max_image_pixels}"
        )


def _load(img: Image.Image) -> None:
    """Forces the full decode so truncation and corruption surface here."""
    try:
        img.load()
    except Exception as exc:
        raise InvalidInput(
            f"truncated or corrupt {img.format} image: {type(exc).__name__}: {exc}"
        ) from exc


def _to_rgb(img: Image.Image) -> np.ndarray:
    mode = img.mode
    if mode == "RGB":
        return np.asarray(img)
    if mode in _SIXTEEN_BIT_MODES or mode == "I":
        return _gray16_to_rgb(np.asarray(img), mode)
    if mode == "F":
        raise InvalidInput("floating-point (mode F) images are not supported; send 8-bit RGB")
    if mode in _ALPHA_MODES or (mode == "P" and "transparency" in img.info):
        return _over_white(img)
    try:
        return np.asarray(img.convert("RGB"))
    except Exception as exc:
        raise InvalidInput(f"unsupported pixel mode {mode!r}") from exc


def _gray16_to_rgb(gray: np.ndarray, mode: str) -> np.ndarray:
    """Keeps the 8 most significant bits (PIL's own convert clips at 255)."""
    if gray.ndim != 2:
        raise InvalidInput(f"unsupported pixel mode {mode!r} with shape {gray.shape}")
    if gray.size and (int(gray.min()) < 0 or int(gray.max()) > 0xFFFF):
        raise InvalidInput(f"{mode} image values outside 0..65535 are not supported")
    eight = (gray.astype(np.uint32, copy=False) >> 8).astype(np.uint8)
    return np.ascontiguousarray(np.broadcast_to(eight[:, :, None], (*eight.shape, 3)))


def _over_white(img: Image.Image) -> np.ndarray:
    rgba = img.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (*_WHITE, 255))
    return np.asarray(Image.alpha_composite(background, rgba).convert("RGB"))
