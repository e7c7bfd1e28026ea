"""decode_tile: real PNG/JPEG/TIFF bytes in, uint8 RGB out, InvalidInput for all else."""

from __future__ import annotations

import io
import struct
import time
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

from predictor.codecs.images import decode_tile
from predictor.config import LimitsConfig
from predictor.errors import InvalidInput


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width x height`` and carries no pixel data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    crc = struct.pack(">I", zlib.crc32(chunk) & 0xFFFFFFFF)
    iend = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND") & 0xFFFFFFFF)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + crc + iend


@pytest.fixture
def load_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every full decode (``ImageFile.load``) attempted."""
    calls: list[str] = []
    original = ImageFile.ImageFile.load

    def spy(self):
        calls.append(self.format)
        return original(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    return calls


def assert_rgb(array: np.ndarray, height: int, width: int) -> None:
    assert array.dtype == np.uint8
    assert array.shape == (height, width, 3)
    assert array.flags.c_contiguous


# --- roundtrips -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "kwargs"),
    [
        ("PNG", {}),
        ("TIFF", {}),
        ("TIFF", {"compression": "tiff_lzw"}),
        ("TIFF", {"compression": "tiff_deflate"}),
    ],
)
def test_lossless_formats_roundtrip_exactly(encode, rgb, limits, fmt, kwargs):
    out = decode_tile(encode(rgb, fmt, **kwargs), limits=limits)
    assert_rgb(out, *rgb.shape[:2])
    np.testing.assert_array_equal(out, rgb)


def test_jpeg_roundtrip_is_close(encode, limits):
    smooth = np.zeros((64, 48, 3), np.uint8)
    smooth[..., 0] = np.linspace(0, 255, 48, dtype=np.uint8)[None, :]
    smooth[..., 1] = np.linspace(0, 255, 64, dtype=np.uint8)[:, None]
    smooth[..., 2] = 128
    out = decode_tile(encode(smooth, "JPEG", quality=95), limits=limits)
    assert_rgb(out, 64, 48)
    assert np.abs(out.astype(int) - smooth.astype(int)).mean() < 3


def test_accepts_bytearray_and_memoryview(encode, rgb, limits):
    data = encode(rgb, "PNG")
    np.testing.assert_array_equal(decode_tile(bytearray(data), limits=limits), rgb)
    np.testing.assert_array_equal(decode_tile(memoryview(data), limits=limits), rgb)


def test_grayscale_becomes_three_equal_channels(encode, limits):
    gray = np.arange(30, dtype=np.uint8).reshape(5, 6) * 8
    out = decode_tile(encode(gray, "PNG"), limits=limits)
    assert_rgb(out, 5, 6)
    for channel in range(3):
        np.testing.assert_array_equal(out[..., channel], gray)


def test_sixteen_bit_grayscale_keeps_the_high_byte(encode, limits):
    gray16 = (np.arange(20, dtype=np.uint16).reshape(4, 5) * 3000).astype(np.uint16)
    for fmt in ("PNG", "TIFF"):
        out = decode_tile(encode(gray16, fmt), limits=limits)
        assert_rgb(out, 4, 5)
        np.testing.assert_array_equal(out[..., 1], (gray16 >> 8).astype(np.uint8))


def png16(array: np.ndarray, color_type: int) -> bytes:
    """A 16-bit PNG written by hand (PIL cannot save 16-bit RGB)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        return struct.pack(">I", len(data)) + kind + data + crc

    height, width = array.shape[:2]
    rows = b"".join(b"\x00" + array[y].astype(">u2").tobytes() for y in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def test_sixteen_bit_colour_keeps_the_high_byte(limits):
    rgb16 = (np.arange(2 * 3 * 3).reshape(2, 3, 3) * 7000).astype(np.uint16)
    np.testing.assert_array_equal(decode_tile(png16(rgb16, 2), limits=limits), rgb16 >> 8)
    rgba16 = (np.arange(2 * 3 * 4).reshape(2, 3, 4) * 5000).astype(np.uint16)
    rgba16[..., 3] = 0xFFFF
    out = decode_tile(png16(rgba16, 6), limits=limits)
    np.testing.assert_array_equal(out, rgba16[..., :3] >> 8)


def test_alpha_is_composited_over_white(encode, limits):
    rgba = np.zeros((2, 3, 4), np.uint8)
    rgba[0, 0] = (10, 20, 30, 255)  # opaque: kept exactly
    rgba[0, 1] = (10, 20, 30, 0)  # transparent: white
    rgba[0, 2] = (0, 0, 0, 128)  # half: grey
    out = decode_tile(encode(rgba, "PNG"), limits=limits)
    assert_rgb(out, 2, 3)
    assert tuple(out[0, 0]) == (10, 20, 30)
    assert tuple(out[0, 1]) == (255, 255, 255)
    assert 120 <= out[0, 2, 0] <= 135


def test_palette_and_bilevel_images_convert(rgb, limits):
    for mode in ("P", "1", "CMYK"):
        img = Image.fromarray(rgb).convert(mode)
        buffer = io.BytesIO()
        img.save(buffer, "TIFF" if mode == "CMYK" else "PNG")
        out = decode_tile(buffer.getvalue(), limits=limits)
        assert_rgb(out, *rgb.shape[:2])
        np.testing.assert_array_equal(out, np.asarray(img.convert("RGB")))


def test_palette_with_transparency_goes_over_white(limits):
    img = Image.new("P", (2, 1))
    img.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    img.putpixel((0, 0), 0)
    img.putpixel((1, 0), 1)
    buffer = io.BytesIO()
    img.save(buffer, "PNG", transparency=0)
    out = decode_tile(buffer.getvalue(), limits=limits)
    assert tuple(out[0, 0]) == (255, 255, 255)
    assert tuple(out[0, 1]) == (200, 10, 10)


# --- refusals ---------------------------------------------------------------


def refused(data, limits=None, *, match: str) -> InvalidInput:
    with pytest.raises(InvalidInput, match=match) as info:
        decode_tile(data, limits=limits or LimitsConfig())
    assert info.value.input_name is None and info.value.tile is None  # caller locates it
    return info.value


def test_empty_and_non_bytes_are_refused():
    refused(b"", match="empty image data")
    refused("iVBORw0KGgo=", match="must be bytes, got str")
    refused(None, match="must be bytes, got NoneType")


def test_oversized_encoding_is_refused_before_opening(encode, rgb, load_calls):
    data = encode(rgb, "PNG")
    refused(
        data, LimitsConfig(max_image_bytes=len(data) - 1), match=f"{len(data)} bytes, more than"
    )
    assert load_calls == []


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "WEBP"])
def test_other_formats_are_refused(encode, rgb, fmt):
    refused(encode(rgb, fmt), match="not a PNG, JPEG, TIFF image")


def test_garbage_is_refused():
    refused(b"hello, this is not an image", match="not a PNG, JPEG, TIFF image")


def test_float_tiff_is_refused(encode):
    refused(encode(np.ones((3, 3), np.float32), "TIFF"), match="floating-point")


def test_header_bomb_is_refused_without_decoding(load_calls):
    start = time.perf_counter()
    refused(png_header_only(100_000, 100_000), match="decompression bomb|more than the limit")
    refused(png_header_only(5000, 5000), match="5000x5000 = 25000000 pixels, more than the limit")
    assert load_calls == []
    assert time.perf_counter() - start < 0.5


def test_real_image_over_pixel_limit_is_refused_without_decoding(encode, load_calls):
    data = encode(np.zeros((300, 300, 3), np.uint8), "PNG")
    refused(data, LimitsConfig(max_image_pixels=1000), match="300x300 = 90000 pixels")
    assert load_calls == []


def test_pil_bomb_error_becomes_invalid_input(monkeypatch, encode, rgb):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    refused(encode(rgb, "PNG"), match="decompression bomb")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "TIFF"])
def test_truncated_images_are_refused(encode, fmt):
    noise = np.random.default_rng(1).integers(0, 256, size=(128, 128, 3), dtype=np.uint8)
    data = encode(noise, fmt)
    refused(data[: len(data) // 2], match=r"truncated or corrupt|cannot decode|unreadable")


def test_corrupt_png_stream_is_refused(encode, rgb):
    data = bytearray(encode(rgb, "PNG"))
    idat = data.index(b"IDAT") + 8
    data[idat : idat + 64] = bytes(64)
    refused(bytes(data), match="truncated or corrupt PNG")


# --- property: nothing but InvalidInput escapes ------------------------------


def _decode_or_refuse(data: bytes, limits: LimitsConfig) -> None:
    try:
        out = decode_tile(data, limits=limits)
    except InvalidInput:
        return
    assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_only_raise_invalid_input(data):
    _decode_or_refuse(data, LimitsConfig(max_image_pixels=256 * 256))


@pytest.fixture(scope="module")
def valid_images() -> list[bytes]:
    rng = np.random.default_rng(2)
    tile = rng.integers(0, 256, size=(24, 20, 3), dtype=np.uint8)
    out = []
    for fmt in ("PNG", "JPEG", "TIFF"):
        buffer = io.BytesIO()
        Image.fromarray(tile).save(buffer, fmt)
        out.append(buffer.getvalue())
    return out


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    which=st.integers(0, 2),
    cut=st.integers(0, 4000),
    flips=st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=8),
)
def test_mutated_images_only_raise_invalid_input(valid_images, which, cut, flips):
    data = bytearray(valid_images[which])
    for position, value in flips:
        data[position % len(data)] = value
    _decode_or_refuse(
        bytes(data[: max(1, cut % (len(data) + 1))]), LimitsConfig(max_image_pixels=256 * 256)
    )
