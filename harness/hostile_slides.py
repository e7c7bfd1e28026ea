"""Hostile slides for the native reader: what a broken or malicious file can declare.

Each is a small JPEG-tiled TIFF (:func:`base_slide`, 4 x 3 tiles of 256 px,
Aperio-style with shared ``JPEGTables``) changed in one way, or a TIFF
written by hand (:func:`sparse_tiles`), in the style of
:mod:`harness.jpeg_slides`. :data:`TILE_CHANGES` are the changes to one
tile's bytes; :func:`padded_tables` inflates a page's tables;
:func:`sparse_tiles` declares millions of tiles in a 4 KiB sparse file.
The corpus test reads each with the native reader and with OpenSlide and
holds them to the same outcome and the same pixels.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from harness import jpeg_slides, slides
from histoserve.slides.tiff.jpeg_tiles import segments

TILE = 256
# 4 x 3 tiles, tissue everywhere, one level: every tile is read by the corpus.
SPEC = slides.SlideSpec(
    width=4 * TILE,
    height=3 * TILE,
    boxes=((0, 0, 4 * TILE, 3 * TILE),),
    vendor="aperio",
    downsamples=(1,),
    tile=TILE,
)
BROKEN_TILE = 5  # column 1, row 1 (not the first tile: the reader checks that one at open)


def base_slide(path: Path) -> Path:
    """The slide every tile change starts from (checked with OpenSlide as it is written)."""
    return jpeg_slides.jpeg_tiff(path, SPEC).path


def _frame_size(data: bytes) -> tuple[int, int]:
    start = data.find(b"\xff\xc0")
    height, width = struct.unpack(">HH", data[start + 5 : start + 9])
    return width, height


def _texture(width: int, height: int) -> np.ndarray:
    return np.ascontiguousarray(np.tile(slides.he_tile(), (2, 2, 1))[:height, :width])


def one_component(data: bytes) -> bytes:
    """The tile as a whole one-component (grey) JPEG of the same size (OpenSlide refuses it)."""
    import simplejpeg

    width, height = _frame_size(data)
    grey = _texture(width, height).mean(axis=2, dtype=np.float32).astype(np.uint8)[:, :, None]
    return simplejpeg.encode_jpeg(np.ascontiguousarray(grey), quality=60, colorspace="GRAY")


def four_component(data: bytes) -> bytes:
    """The tile as a whole four-component (YCCK) JPEG of the same size."""
    import simplejpeg

    width, height = _frame_size(data)
    cmyk = np.concatenate([_texture(width, height), np.full((height, width, 1), 0, np.uint8)], 2)
    return simplejpeg.encode_jpeg(np.ascontiguousarray(cmyk), quality=40, colorspace="CMYK")


def other_size(data: bytes) -> bytes:
    """A whole, valid JPEG of half the TIFF's tile size (its frame says so)."""
    import simplejpeg

    width, height = _frame_size(data)
    return simplejpeg.encode_jpeg(_texture(width // 2, height // 2), quality=80, colorspace="RGB")


def rgb_ids(data: bytes) -> bytes:
    """The tile with its components named R, G, B (libjpeg alone would read it as RGB-coded)."""
    out = bytearray(data)
    frame, scan = data.find(b"\xff\xc0"), data.find(b"\xff\xda")
    for k, name in enumerate(b"RGB"):
        out[frame + 10 + 3 * k] = name  # the frame's component ids
        out[scan + 5 + 2 * k] = name  # the scan's references to them
    return bytes(out)


def progressive(data: bytes) -> bytes:
    """The tile's pixels (as OpenSlide decodes them) re-encoded as a whole progressive JPEG."""
    import io

    from PIL import Image

    width, height = _frame_size(data)
    buffer = io.BytesIO()
    Image.fromarray(_texture(width, height)).save(buffer, "JPEG", quality=70, progressive=True)
    return buffer.getvalue()


def comments(size: int) -> bytes:
    """``size`` bytes of payload in JPEG comment (COM) segments, which decoders skip."""
    chunks = [65_533] * (size // 65_533) + ([size % 65_533] if size % 65_533 else [])
    return b"".join(b"\xff\xfe" + struct.pack(">H", n + 2) + b"x" * n for n in chunks)


def comment_padded(data: bytes, extra: int = 20_000) -> bytes:
    """The tile with ``extra`` bytes of comments after its SOI: valid, only larger."""
    own, rest = segments(data)
    return b"\xff\xd8" + comments(extra) + b"".join(seg for _, seg in own) + rest


def zeros(data: bytes) -> bytes:
    """The tile's bytes all zero (no JPEG at all)."""
    return b"\0" * len(data)


def truncated(data: bytes) -> bytes:
    """The tile cut at half its bytes (the rest zeros)."""
    return data[: len(data) // 2]


def odd_sampling(data: bytes) -> bytes:
    """The tile's luma sampling factors made 2x3 (libjpeg decodes such a frame, TurboJPEG
    does not; the scan is read with another block layout: other pixels, no error)."""
    start = data.find(b"\xff\xc0")
    return data[: start + 11] + b"\x23" + data[start + 12 :]


def junk_before_eoi(data: bytes) -> bytes:
    """The tile with 100 junk bytes between its scan's end and its EOI (OpenSlide never reads them)."""
    end = data.rindex(b"\xff\xd9")
    return data[:end] + bytes(range(1, 101)) + data[end:]


def no_eoi(data: bytes) -> bytes:
    """The tile without its EOI marker (the scan whole)."""
    return data[: data.rindex(b"\xff\xd9")]


TILE_CHANGES: dict[str, Callable[[bytes], bytes]] = {
    "one-component": one_component,
    "four-component": four_component,
    "other-size": other_size,
    "declared-65500px": jpeg_slides.huge_frame,
    "rgb-component-ids": rgb_ids,
    "progressive": progressive,
    "comment-padded": comment_padded,
    "zeros": zeros,
    "truncated": truncated,
    "corrupt-scan": jpeg_slides.corrupt_scan,
    "junk-before-eoi": junk_before_eoi,
    "odd-sampling": odd_sampling,
    "no-eoi": no_eoi,
}
"""Changes to one tile's bytes, by name; the result is written in a longer slot when it
does not fit (:func:`replace_tile`)."""


def replace_tile(src: Path, dst: Path, index: int, change: Callable[[bytes], bytes]) -> Path:
    """A copy of ``src`` whose tile ``index`` of page 0 is ``change``\\ d, appended at the
    end of the file when longer than the old one (its offset and byte count patched)."""
    import tifffile

    if Path(src).resolve() != Path(dst).resolve():
        shutil.copyfile(src, dst)
    with tifffile.TiffFile(dst) as tif:
        page = tif.pages[0]
        offset, count = int(page.dataoffsets[index]), int(page.databytecounts[index])
        offsets_at = page.tags["TileOffsets"].valueoffset
        counts_at = page.tags["TileByteCounts"].valueoffset
    with open(dst, "r+b") as handle:
        handle.seek(offset)
        new = change(handle.read(count))
        if len(new) <= count:
            handle.seek(offset)
            handle.write(new.ljust(count, b"\0"))
            return Path(dst)
        end = handle.seek(0, 2)
        handle.write(new)
        handle.seek(offsets_at + 4 * index)
        handle.write(struct.pack("<I", end))
        handle.seek(counts_at + 4 * index)
        handle.write(struct.pack("<I", len(new)))
    return Path(dst)


def empty_tile(src: Path, dst: Path, index: int, level: int = 0) -> Path:
    """A copy of ``src`` whose tile ``index`` of tiled page ``level`` declares 0 bytes
    (``TileByteCounts`` 0: a missing tile, as a scanner leaves one it skipped)."""
    import tifffile

    if Path(src).resolve() != Path(dst).resolve():
        shutil.copyfile(src, dst)
    with tifffile.TiffFile(dst) as tif:
        page = [p for p in tif.pages if p.is_tiled][level]
        counts_at = page.tags["TileByteCounts"].valueoffset
    with open(dst, "r+b") as handle:
        handle.seek(counts_at + 4 * index)
        handle.write(struct.pack("<I", 0))
    return Path(dst)


def padded_tables(src: Path, dst: Path, pad_bytes: int) -> Path:
    """A copy of ``src`` whose every page's ``JPEGTables`` carry ``pad_bytes`` more in COM
    segments (valid JPEG, ignored by decoders): the tables move to the end of the file."""
    import tifffile

    shutil.copyfile(src, dst)
    with tifffile.TiffFile(dst) as tif:
        spots = [(p.tags["JPEGTables"].offset, p.jpegtables) for p in tif.pages]
    padding = comments(pad_bytes)
    with open(dst, "r+b") as handle:
        for entry_at, tables in spots:
            padded = tables[:2] + padding + tables[2:]
            end = handle.seek(0, 2)
            handle.write(padded)
            handle.seek(entry_at + 4)  # classic TIFF entry: code, type, count, offset
            handle.write(struct.pack("<II", len(padded), end))
    return Path(dst)


def sparse_tiles(
    path: Path,
    tiles_per_edge: int = 4096,
    tile: int = 16,
    *,
    byteorder: str = "<",
    bigtiff: bool = False,
) -> Path:
    """A JPEG-tiled TIFF declaring ``tiles_per_edge``\\ ^2 tiles whose offset and byte-count
    arrays are holes: a few KiB on disk, 16.7 M tiles by default (every one empty).

    ``byteorder`` ``<`` (``II``) or ``>`` (``MM``); ``bigtiff``: 64-bit offsets and
    counts (``+`` in place of ``*``), as OpenSlide and tifffile read either.
    """
    n = tiles_per_edge * tiles_per_edge
    edge = tiles_per_edge * tile
    wide = 16 if bigtiff else 4  # LONG8 or LONG offsets and counts
    step = 8 if bigtiff else 4
    entries = [  # (tag, type, count, value): 3 SHORT, 4 LONG
        (256, 4, 1, edge),
        (257, 4, 1, edge),
        (258, 3, 3, "bits"),
        (259, 3, 1, 7),
        (262, 3, 1, 2),
        (277, 3, 1, 3),
        (284, 3, 1, 1),
        (322, 3, 1, tile),
        (323, 3, 1, tile),
        (324, wide, n, "offsets"),
        (325, wide, n, "counts"),
    ]
    order = byteorder
    if bigtiff:
        head = struct.pack(f"{order}HHHHQQ", 0, 43, 8, 0, 16, len(entries))
        entry = f"{order}HHQ"
        bits_at = 16 + 8 + 20 * len(entries) + 8
    else:
        head = struct.pack(f"{order}HHIH", 0, 42, 8, len(entries))
        entry = f"{order}HHI"
        bits_at = 8 + 2 + 12 * len(entries) + 4
    body = bytearray((b"II" if order == "<" else b"MM") + head[2:])
    where = {"bits": bits_at, "offsets": 4096, "counts": 4096 + step * n}
    value_size = 8 if bigtiff else 4
    for tag, kind, count, value in entries:
        value = where.get(value, value) if isinstance(value, str) else value
        body += struct.pack(entry, tag, kind, count)
        if kind == 3 and count == 1:  # a SHORT inline, left-justified in the value field
            body += struct.pack(f"{order}H", value) + bytes(value_size - 2)
        else:
            body += struct.pack(f"{order}{'Q' if bigtiff else 'I'}", value)
    body += bytes(value_size) + struct.pack(f"{order}HHH", 8, 8, 8)
    with open(path, "wb") as handle:
        handle.write(body)
        handle.truncate(where["counts"] + step * n)
    return Path(path)
