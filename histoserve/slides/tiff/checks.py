"""Refuse a TIFF copied short, or one declaring more than a slide can be, before any backend opens it.

A slide whose tile data or directory chain runs past the end of its file (a
broken download or copy) would otherwise open in tiffslide and fail tile by
tile, or fail deep inside OpenSlide; here it is one
:class:`~histoserve.errors.SlideError` at open that says to copy it again.

The same pass over the directories (tile offsets and byte counts, read by
``tifffile`` in a fraction of a second) bounds what the file declares: its
pages (:data:`~histoserve.limits.MAX_TIFF_PAGES`) and its tiles over all
pages (:data:`~histoserve.limits.MAX_TIFF_TILES`), what a backend's open
costs: OpenSlide's builds a record per declared tile (a 4 KiB sparse file
declaring 16.7 M tiles took it 13-114 s and over 600 MB, before a single pixel
was asked for). Its pixels are bounded next, from the opened slide's
dimensions and mpp (:func:`~histoserve.slides.grid.plan_tiles`: a size in
millimetres says more than a count of pixels), which costs no backend more
than its open.

A TIFF is known by its first bytes (:func:`is_tiff`: classic or BigTIFF,
either byte order), as OpenSlide and tiffslide know it, never by its name: a
sparse TIFF named ``.dat`` costs OpenSlide's open as much as one named
``.tif``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from histoserve.errors import SlideError
from histoserve.limits import MAX_TIFF_PAGES, MAX_TIFF_TILES

TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
"""A TIFF's first four bytes: classic and BigTIFF, little- and big-endian."""


def is_tiff(path: Path) -> bool:
    """Whether ``path`` starts as a TIFF does (:data:`TIFF_MAGICS`), whatever its name.

    A file that cannot be opened is not a TIFF here: the backends say why.
    """
    try:
        with open(path, "rb") as handle:
            return handle.read(4) in TIFF_MAGICS
    except OSError:
        return False


def check_tiff_complete(path: Path) -> None:
    """Refuse a TIFF whose tile data or IFD chain runs past the end of the file, or
    that declares more pages or tiles than a slide can have.

    Reads only the TIFF directories (tile offset and byte-count arrays), not the
    pixels. A file is a TIFF by its magic bytes (:func:`is_tiff`), not its name;
    files that are not TIFF are left to the backends.
    """
    if not is_tiff(path):
        return
    import tifffile

    size = path.stat().st_size
    try:
        with tifffile.TiffFile(path) as tif:
            pages = _pages(tif, path)
            if pages and _next_ifd_offset(tif, pages[-1].offset) >= size:
                raise SlideError(
                    f"slide {path} is truncated: its directory chain points past the end of "
                    f"the file ({size} bytes); copy the slide again"
                )
            tiles = 0
            for index, page in enumerate(pages):
                tiles += _declared_tiles(page)  # from the tag's count: no array read yet
                if tiles > MAX_TIFF_TILES:
                    raise SlideError(
                        f"slide {path}: its directories declare more than {MAX_TIFF_TILES:,} "
                        f"tiles or strips (the limit; a 75 x 50 mm slide at 0.25 um/px has "
                        "1.4 M): not a slide this program reads"
                    )
                offsets = np.asarray(page.dataoffsets, dtype=np.int64)
                counts = np.asarray(page.databytecounts, dtype=np.int64)
                end = int((offsets + counts).max()) if offsets.size else 0
                if end > size:
                    raise SlideError(
                        f"slide {path} is truncated: image {index} needs {end} bytes but the "
                        f"file has {size}; copy the slide again"
                    )
    except SlideError:
        raise
    except Exception:  # not a TIFF tifffile understands: OpenSlide decides
        return


def _pages(tif: Any, path: Path) -> list[Any]:
    """The file's pages, refused past :data:`MAX_TIFF_PAGES` (counted while listed)."""
    pages = []
    for page in tif.pages:
        pages.append(page)
        if len(pages) > MAX_TIFF_PAGES:
            raise SlideError(
                f"slide {path}: more than {MAX_TIFF_PAGES:,} TIFF directories (the limit; a "
                "slide has a few, a multiplexed one a few hundred): not a slide this program reads"
            )
    return pages


def _declared_tiles(page: Any) -> int:
    """How many tiles or strips the page's TileOffsets (or StripOffsets) tag declares."""
    for code in (324, 273):
        tag = page.tags.get(code)
        if tag is not None:
            return int(tag.count)
    return 0


def _next_ifd_offset(tif: Any, ifd_offset: int) -> int:
    """The "next IFD" pointer stored after the directory at ``ifd_offset`` (0: last one)."""
    import struct

    header = tif.tiff
    handle = tif.filehandle
    handle.seek(ifd_offset)
    (count,) = struct.unpack(header.tagnoformat, handle.read(header.tagnosize))
    handle.seek(ifd_offset + header.tagnosize + count * header.tagsize)
    raw = handle.read(header.offsetsize)
    if len(raw) < header.offsetsize:
        return 1 << 62  # the directory itself is cut short
    return int(struct.unpack(header.offsetformat, raw)[0])
