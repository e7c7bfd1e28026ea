"""A JPEG-compressed TIFF tile as one decodable stream, decoded exactly as OpenSlide does.

A TIFF's JPEG tile is often an abbreviated stream: its quantisation and
Huffman tables sit once per page in the ``JPEGTables`` tag (347).
:func:`tile_stream` makes a whole stream of one tile: SOI, an Adobe APP14
marker saying YCbCr (transform 1), the shared tables' segments, then the
tile's own segments after its SOI, with any JFIF APP0 or Adobe APP14 of the
tile left out.

Why the forced YCbCr: OpenSlide 4.0.1 decodes every three-component JPEG
tile of an Aperio or generic TIFF as YCbCr, whatever its markers say
(measured on generated TIFFs: a tile coded in RGB, with an Adobe transform-0
marker or components named R, G, B, comes out with its colours converted as
if it were YCbCr). The marker makes libjpeg-turbo take the same path on
every tile, so the pixels are OpenSlide's. A slide whose tiles really are
RGB-coded is not read natively (:func:`jpeg_problem` says so), so the native
reader never gives pixels it knows to be wrong, nor pixels that differ from
OpenSlide's.

Decoding is libjpeg-turbo through ``simplejpeg`` with libjpeg's defaults
(accurate integer DCT, fancy upsampling), as OpenSlide decodes, and strict:
a libjpeg warning (corrupt data, a premature end) is an error, as OpenSlide
makes it while it reads a tile's rows (junk left after a sequential scan,
which OpenSlide never reads, is not: :func:`_only_after_the_scan`). Every
tile's frame header is checked against the TIFF's own
declaration before anything is decoded (:func:`check_frame`: three 8-bit
components, the TIFF's tile size), so a tile OpenSlide refuses is refused
here too, and none is allocated at a size the TIFF does not declare.

A stream (:func:`tile_stream`) is also what a V2 input carrying the slide's
own tiles would send: the tables are spliced in, nothing is decoded.
"""

from __future__ import annotations

import functools
import struct

import numpy as np

SOI, EOI, SOS, APP0, APP14 = 0xD8, 0xD9, 0xDA, 0xE0, 0xEE
# Huffman-coded frames (baseline, extended, progressive): what OpenSlide's libjpeg decodes.
_HUFFMAN_FRAMES = (0xC0, 0xC1, 0xC2)
_ALL_FRAMES = (*_HUFFMAN_FRAMES, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)
_STANDALONE = (0x01, *range(0xD0, 0xD8))
_ADOBE_YCBCR = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x01"
# Component ids 'R', 'G', 'B': libjpeg reads such a frame as RGB-coded.
_RGB_IDS = (82, 71, 66)


# Luma sampling factors (h, v) with 1x1 chroma that TurboJPEG, simplejpeg's API, decodes
# (4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1); libjpeg, OpenSlide's, decodes any.
_TURBO_SAMPLING = ((1, 1), (2, 1), (2, 2), (1, 2), (4, 1))


class JpegTileError(ValueError):
    """A tile's JPEG data is malformed, truncated or not the size the TIFF declares."""


class UnusualSampling(JpegTileError):
    """A valid tile whose chroma sampling libjpeg-turbo's TurboJPEG API cannot decode
    (OpenSlide's libjpeg can): read through OpenSlide instead."""


def segments(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The marker segments after SOI up to the first SOS, and the rest (SOS onwards).

    Raises:
        JpegTileError: No SOI, a segment running past the data, no SOS or EOI.
    """
    if data[:2] != b"\xff\xd8":
        raise JpegTileError("no JPEG start-of-image marker")
    out, i, size = [], 2, len(data)
    while i < size:
        if data[i] != 0xFF:
            raise JpegTileError(f"expected a marker at byte {i}, found 0x{data[i]:02x}")
        while i < size and data[i] == 0xFF:  # fill bytes
            i += 1
        if i >= size:
            break
        marker = data[i]
        if marker in (SOS, EOI):
            return out, data[i - 1 :]
        if marker in _STANDALONE:
            i += 1
            continue
        if i + 3 > size:
            break
        (length,) = struct.unpack(">H", data[i + 1 : i + 3])
        if length < 2 or i + 1 + length > size:
            raise JpegTileError(f"marker 0x{marker:02x} at byte {i} runs past the data")
        out.append((marker, data[i - 1 : i + 1 + length]))
        i += 1 + length
    raise JpegTileError("the data ends before its scan (truncated)")


def tile_stream(tables: bytes | None, tile: bytes, width: int, height: int) -> bytes:
    """One tile as a whole JPEG stream decoded as YCbCr (see the module's docstring).

    ``width`` x ``height``: the TIFF's tile size, which the tile's own frame
    must declare (:func:`check_frame`).

    Raises:
        JpegTileError: Malformed tables or tile headers, or a frame that is not
            the TIFF's (components, precision, size).
    """
    own, rest = segments(tile)
    check_frame(next((seg for marker, seg in own if marker in _ALL_FRAMES), None), width, height)
    parts = [_stream_head(tables or b"")]
    parts += [seg for marker, seg in own if marker not in (APP0, APP14)]
    parts.append(rest)
    return b"".join(parts)


@functools.lru_cache(maxsize=16)
def _stream_head(tables: bytes) -> bytes:
    """SOI, the YCbCr marker and the shared tables' segments: once per page, not per tile."""
    shared = segments(tables)[0] if tables else []
    return b"".join(
        [b"\xff\xd8", _ADOBE_YCBCR, *(seg for marker, seg in shared if marker not in (APP0, APP14))]
    )


def check_frame(frame: bytes | None, width: int, height: int) -> None:
    """Refuse a tile whose frame header (SOF) is not what its TIFF declares.

    Every tile, not only a page's first: three components (OpenSlide decodes a
    tile as YCbCr, and refuses a one- or four-component one as "Bogus JPEG
    colorspace"; libjpeg-turbo alone would give a grey tile), 8 bits, and the
    TIFF's ``width`` x ``height`` (before any pixel is allocated). The header
    only: the segments are already split, nothing is decoded.

    Raises:
        JpegTileError: Why the tile is not the TIFF's.
    """
    if frame is None:
        raise JpegTileError("no JPEG frame header (SOF) before its scan")
    if len(frame) < 10:
        raise JpegTileError("its JPEG frame header is cut short")
    components, precision = frame[9], frame[4]
    if components != 3:
        raise JpegTileError(
            f"its JPEG has {components} component(s) where the TIFF declares 3 samples per pixel "
            "(OpenSlide: Bogus JPEG colorspace)"
        )
    if precision != 8:
        raise JpegTileError(f"its JPEG has {precision}-bit samples, not 8")
    h, w = struct.unpack(">HH", frame[5:9])
    if (w, h) != (width, height):
        raise JpegTileError(f"its JPEG says {w}x{h} px, the TIFF's tiles are {width}x{height}")
    if _sampling(frame) not in _TURBO_SAMPLING:
        raise UnusualSampling(f"its JPEG's sampling factors {frame[11:19:3].hex()} are unusual")


def _sampling(frame: bytes) -> tuple[int, int] | None:
    """Luma's (h, v) sampling factors when both chroma components are 1x1, else None."""
    if len(frame) < 19 or frame[14] != 0x11 or frame[17] != 0x11:
        return None
    return frame[11] >> 4, frame[11] & 0x0F


def jpeg_problem(tables: bytes | None, tile: bytes) -> str | None:
    """Why a page whose tile this is cannot be decoded as OpenSlide does (None: it can).

    Looks at the markers only: the frame (Huffman-coded, three 8-bit components)
    and the colour coding (RGB-coded tiles are left to OpenSlide).
    """
    try:
        own, _ = segments(tile)
        shared = segments(tables)[0] if tables else []
    except JpegTileError as exc:
        return f"its first tile is not JPEG data ({exc})"
    frames = [seg for marker, seg in own + shared if marker in _ALL_FRAMES]
    if not frames or frames[0][1] not in _HUFFMAN_FRAMES:
        return "its JPEG tiles are not Huffman-coded (lossless, arithmetic or none)"
    frame = frames[0]
    if len(frame) < 10 or frame[4] != 8 or frame[9] != 3:
        return "its JPEG tiles are not three 8-bit components"
    ids = tuple(frame[10 + 3 * k] for k in range(3)) if len(frame) >= 19 else ()
    adobe = [seg for marker, seg in own + shared if marker == APP14 and seg[4:9] == b"Adobe"]
    if ids == _RGB_IDS or (adobe and len(adobe[0]) > 15 and adobe[0][15] == 0):
        return "its JPEG tiles are RGB-coded (OpenSlide converts them as YCbCr)"
    if _sampling(frame) not in _TURBO_SAMPLING:
        return "its JPEG tiles' chroma sampling is not one libjpeg-turbo's TurboJPEG decodes"
    return None


def _only_after_the_scan(message: str, stream: bytes) -> bool:
    """Whether libjpeg's warning came only after a sequential scan's last row was decoded.

    OpenSlide makes a warning an error while it reads a tile's rows, and reads
    no further: junk between a sequential (baseline) scan's end and its EOI is
    never seen there, and the tile reads (found by fuzzing: a Huffman table
    changed so that the scan ends 3,930 bytes early). libjpeg-turbo reports it
    only when it looks for the EOI, after the rows; a progressive frame's
    scans are all read before its first row, so there it stays an error.
    """
    if "extraneous bytes before marker 0xd9" not in message:
        return False
    frames = [marker for marker, _ in segments(stream)[0] if marker in _ALL_FRAMES]
    return bool(frames) and frames[0] in (0xC0, 0xC1)


def decode_tile(stream: bytes, width: int, height: int, factor: int = 1) -> np.ndarray:
    """Decode a whole tile stream at 1/``factor`` scale: uint8 ``[h, w, 3]`` RGB.

    ``factor`` 1, 2, 4 or 8 (libjpeg-turbo's DCT scaling); the result is
    ``ceil(height / factor) x ceil(width / factor)``.

    Raises:
        JpegTileError: The JPEG declares another size than ``width x height``,
            or its data is corrupt or truncated.
    """
    import simplejpeg

    want = (-(-height // factor), -(-width // factor), 3)
    try:
        h, w, _, _ = simplejpeg.decode_jpeg_header(stream)
    except ValueError as exc:
        raise JpegTileError(f"unreadable JPEG header ({exc})") from exc
    if (w, h) != (width, height):
        raise JpegTileError(f"its JPEG says {w}x{h} px, the TIFF's tiles are {width}x{height}")
    options = {"min_height": want[0], "min_width": want[1], "min_factor": factor}
    try:  # the scale is the least at least min_height/width
        pixels = simplejpeg.decode_jpeg(
            stream, colorspace="RGB", fastdct=False, fastupsample=False, **options
        )
    except ValueError as exc:
        if not _only_after_the_scan(str(exc), stream):
            raise JpegTileError(f"corrupt JPEG data ({exc})") from exc
        pixels = simplejpeg.decode_jpeg(
            stream, colorspace="RGB", fastdct=False, fastupsample=False, strict=False, **options
        )
    if pixels.shape != want:
        raise JpegTileError(f"decoded at 1/{factor} to {pixels.shape}, expected {want}")
    return pixels
