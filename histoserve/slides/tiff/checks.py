"""Refuse a TIFF that was copied short, before any backend opens it.

A slide whose tile data or directory chain runs past the end of its file (a
broken download or copy) would otherwise open in tiffslide and fail tile by
tile, or fail deep inside OpenSlide; here it is one
:class:`~histoserve.errors.SlideError` at open that says to copy it again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from histoserve.errors import SlideError

_TIFF_SUFFIXES = (".tif", ".tiff", ".svs", ".btf", ".tf8", ".qptiff", ".scn", ".ndpi", ".bif")


def check_tiff_complete(path: Path) -> None:
    """Refuse a TIFF whose tile data or IFD chain runs past the end of the file.

    Reads only the TIFF directories (tile offset and byte-count arrays), not the
    pixels. Files that are not TIFF are left to the backends.
    """
    if path.suffix.lower() not in _TIFF_SUFFIXES:
        return
    import tifffile

    size = path.stat().st_size
    try:
        with tifffile.TiffFile(path) as tif:
            pages = list(tif.pages)
            if pages and _next_ifd_offset(tif, pages[-1].offset) >= size:
                raise SlideError(
                    f"slide {path} is truncated: its directory chain points past the end of "
                    f"the file ({size} bytes); copy the slide again"
                )
            for index, page in enumerate(pages):
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
