"""DICOM whole-slide images: a folder of ``.dcm`` files is one slide, read by OpenSlide 4.

OpenSlide 4 (the ``openslide-bin`` wheel) reads DICOM WSI through libdicom:
given any instance of a series it finds the other levels in the same folder,
and reports ``openslide.mpp-x``/``-y`` from the instances' Pixel Spacing. So
a slide may be named by its folder (the slide id is the folder's name) or by
one of its ``.dcm`` files; :func:`dicom_instance` picks the file to hand to
OpenSlide.
"""

from __future__ import annotations

from pathlib import Path

_MAGIC_OFFSET, _MAGIC = 128, b"DICM"


def is_dicom_file(path: Path) -> bool:
    """Whether ``path`` is a DICOM Part 10 file (``DICM`` after the 128-byte preamble)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(_MAGIC_OFFSET)
            return handle.read(len(_MAGIC)) == _MAGIC
    except OSError:
        return False


def dicom_instance(folder: Path) -> Path | None:
    """A DICOM file of the slide in ``folder`` (``.dcm`` first, then any DICOM file), or None."""
    files = sorted(p for p in Path(folder).iterdir() if p.is_file())
    named = [p for p in files if p.suffix.lower() == ".dcm"]
    for path in named + [p for p in files if p not in named]:
        if is_dicom_file(path):
            return path
    return None
