"""JPEG-tiled TIFFs the way scanners write them, for the native reader's tests and bench.

:func:`harness.slides.write_slide` writes what ``tifffile`` writes by default:
Photometric YCbCr, a whole JFIF stream per tile. Scanners differ:
:func:`jpeg_tiff` writes the same :class:`~harness.slides.SlideSpec` with
hand-made tiles: Photometric RGB or YCbCr, YCbCr- or RGB-coded JPEG, an Adobe
APP14 marker, a JFIF APP0 or none, the tables once per page in ``JPEGTables``
(Aperio's way) or in every tile. :func:`patch_tile` breaks one tile of a copy
in place (corrupt, truncated, a hostile declared size); :func:`set_tile_size`
makes a copy declare another TIFF tile size.
"""

from __future__ import annotations

import dataclasses
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from harness import slides
from histoserve.slides.tiff.jpeg_tiles import APP0, APP14, segments

_ADOBE = {"ycbcr": 1, "rgb": 0}


def _adobe(transform: int) -> bytes:
    body = b"Adobe" + struct.pack(">HHHB", 100, 0, 0, transform)
    return b"\xff\xee" + struct.pack(">H", len(body) + 2) + body


def _encode(tile: np.ndarray, coding: str, marker: str) -> tuple[bytes, bytes]:
    """``(tables, tile)``: the JPEG's DQT/DHT as a tables stream, and the tile's whole stream."""
    import imagecodecs

    out = "YCBCR" if coding == "ycbcr" else "RGB"
    sub = (2, 2) if coding == "ycbcr" else (1, 1)
    data = imagecodecs.jpeg8_encode(
        tile, level=90, colorspace="RGB", outcolorspace=out, subsampling=sub
    )
    own, rest = segments(data)
    jfif = [seg for m, seg in own if m == APP0]
    head = {"adobe": _adobe(_ADOBE[coding]), "jfif": jfif[0] if jfif else b"", "none": b""}[marker]
    kept = [seg for m, seg in own if m not in (APP0, APP14)]
    tables = b"\xff\xd8" + b"".join(seg for m, seg in own if m in (0xDB, 0xC4)) + b"\xff\xd9"
    return tables, b"\xff\xd8" + head + b"".join(kept) + rest


def _strip_tables(stream: bytes) -> bytes:
    own, rest = segments(stream)
    return b"\xff\xd8" + b"".join(seg for m, seg in own if m not in (0xDB, 0xC4)) + rest


def jpeg_tiff(
    path: Path,
    spec: slides.SlideSpec,
    *,
    photometric: str = "rgb",
    coding: str = "ycbcr",
    marker: str = "none",
    shared_tables: bool = True,
) -> slides.GeneratedSlide:
    """``spec`` (JPEG, any vendor) with hand-made tiles; checked with OpenSlide like any slide.

    ``photometric``: the TIFF tag (``rgb`` as Aperio writes, or ``ycbcr``);
    ``coding``: the JPEG's colour coding; ``marker``: ``adobe`` (transform per
    ``coding``), ``jfif`` or ``none``; ``shared_tables``: tables in ``JPEGTables``.
    """
    import tifffile

    path = Path(path)
    with tifffile.TiffWriter(path, bigtiff=False) as tw:
        for index, d in enumerate(spec.downsamples):
            encoded = [_encode(t, coding, marker) for t in slides._level_tiles(spec, d)]
            tables = encoded[0][0] if shared_tables else None
            if shared_tables and any(t != tables for t, _ in encoded):
                raise RuntimeError("the encoder gave tiles different tables")
            tiles = [_strip_tables(s) if shared_tables else s for _, s in encoded]
            tw.write(
                iter(tiles),
                shape=(spec.height // d, spec.width // d, 3),
                dtype=np.uint8,
                tile=(spec.tile, spec.tile),
                photometric=photometric,
                compression="jpeg",
                jpegtables=tables,
                description=slides._description(spec) if index == 0 else None,
                subfiletype=0 if index == 0 else 1,
                metadata=None,
                **({"subsampling": (2, 2)} if photometric == "ycbcr" else {}),
                **slides._resolution_kwargs(spec, d),
            )
    return slides.GeneratedSlide(path, spec, slides._verify_with_openslide(path, spec))


def _tile_span(path: Path, page: int, index: int) -> tuple[int, int]:
    import tifffile

    with tifffile.TiffFile(path) as tif:
        level = tif.pages[page]
        return int(level.dataoffsets[index]), int(level.databytecounts[index])


def patch_tile(
    src: Path, dst: Path, index: int, change: Callable[[bytes], bytes], page: int = 0
) -> Path:
    """A copy of ``src`` whose tile ``index`` (row-major) of TIFF page ``page`` is ``change``d.

    The new bytes are cut or padded with zeros to the old length, so the file
    keeps its size and directories (it opens; only that tile is broken).
    """
    shutil.copyfile(src, dst)
    offset, count = _tile_span(Path(dst), page, index)
    with open(dst, "r+b") as handle:
        handle.seek(offset)
        old = handle.read(count)
        new = change(old)[:count].ljust(count, b"\0")
        handle.seek(offset)
        handle.write(new)
    return Path(dst)


def huge_frame(data: bytes) -> bytes:
    """``data`` with its JPEG frame declaring 65,500 x 65,500 px (a decompression bomb)."""
    start = data.find(b"\xff\xc0")
    if start < 0:
        raise ValueError("no baseline frame marker in the tile")
    return data[: start + 5] + struct.pack(">HH", 65500, 65500) + data[start + 9 :]


def set_tile_size(src: Path, dst: Path, edge: int) -> Path:
    """A copy of ``src`` whose first page declares ``edge`` x ``edge`` px TIFF tiles."""
    import tifffile

    shutil.copyfile(src, dst)
    with tifffile.TiffFile(dst) as tif:
        tags = tif.pages[0].tags
        spots = [(tags[name].valueoffset, tags[name].dtype) for name in ("TileWidth", "TileLength")]
    with open(dst, "r+b") as handle:
        for offset, dtype in spots:
            handle.seek(offset)
            handle.write(struct.pack("<H" if int(dtype) == 3 else "<I", edge))
    return Path(dst)


def two_slide_tiles(edge: int = 256) -> list[bytes]:
    """Two neighbouring ``edge``-px slide tiles of H&E texture as q90 JPEGs (the transport's unit)."""
    import simplejpeg

    from harness.slides import he_tile

    texture = np.tile(he_tile(), (2, 3, 1))[:edge, : 2 * edge]
    halves = [np.ascontiguousarray(texture[:, i * edge : (i + 1) * edge]) for i in (0, 1)]
    return [simplejpeg.encode_jpeg(h, quality=90, colorspace="RGB") for h in halves]


def corrupt_scan(stream: bytes) -> bytes:
    """``stream`` with a readable header over scan data libjpeg-turbo refuses (a stray restart marker)."""
    half = len(stream) // 2
    return stream[:half] + b"\xff\xd3" + stream[half + 2 :]


def slides_a_and_b(root: Path) -> Path:
    """``root`` holding the transport's three cases, for the embed tests of the native reader.

    ``b.svs``: Aperio-style, 0.25 um/px with a level at 0.5 (a matching level);
    ``a.svs``: the same without it (levels 1/16: 448 px read and resized);
    ``deflate.tif``: a tiled TIFF that is not JPEG (OpenSlide's, never native).
    """
    spec_b = slides.SlideSpec(mpp=(0.25, 0.25), vendor="aperio", **slides.standard_layout(448))
    jpeg_tiff(root / "b.svs", spec_b)
    jpeg_tiff(root / "a.svs", dataclasses.replace(spec_b, downsamples=(1, 16)))
    slides.generic_tiff(root / "deflate.tif")
    return root
