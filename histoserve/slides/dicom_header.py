"""The Series Instance UID of a DICOM file, read by pydicom from the file's first bytes.

A scanner's export folder holds the files of many slides; OpenSlide (libdicom)
reads a slide as the files of one series, the ones sharing the Series
Instance UID ``(0020,000E)`` of the file it is given. A slide's identity
(:mod:`~histoserve.slides.identity`) must cover those files and no
others, so adding slide B to the folder does not re-embed slide A.

:func:`read_series` hands pydicom (the ``slides`` extra, imported only when a
file is read) a copy of the file's first bytes, at most
:data:`MAX_HEADER_BYTES` (the UID comes long before the pixels), and stops it
at the first top-level element past the UID. A file is DICOM when it is a
Part 10 file (``DICM`` after the 128-byte preamble); a Part 10 file pydicom
cannot read (truncated, malformed, the UID cut off or past the bytes read)
has an unknown series. So does a deflated data set: pydicom inflates one
whole, and a small file could inflate to gigabytes, so the copy refuses an
unbounded read.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import BinaryIO

MAX_HEADER_BYTES = 1 << 20
_FIRST_READ = 64 << 10
_PREAMBLE, _MAGIC = 128, b"DICM"
_SERIES_UID = 0x0020000E


@dataclass(frozen=True)
class DicomFile:
    """A DICOM Part 10 file's series: ``series_uid`` None when it cannot be read."""

    series_uid: str | None


class _Header(io.BytesIO):
    """A file's first bytes for pydicom; a read of "all the rest" (inflating) is refused."""

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            raise OSError("an unbounded read of a DICOM header")
        return super().read(size)


def read_series(handle: BinaryIO) -> DicomFile | None:
    """The file ``handle`` reads as DICOM (its series), or None when it is no DICOM Part 10 file.

    ``handle`` is read from where it stands (the file's start), at most
    :data:`MAX_HEADER_BYTES`; the caller opens it (regular files only).

    Raises:
        OSError: The file cannot be read.
    """
    data = handle.read(_FIRST_READ)
    if data[_PREAMBLE : _PREAMBLE + len(_MAGIC)] != _MAGIC:
        return None
    uid = _series_uid(data)
    if uid is None and len(data) == _FIRST_READ:  # a longer header: once more, all of it
        data += handle.read(MAX_HEADER_BYTES - _FIRST_READ)
        uid = _series_uid(data)
    return DicomFile(uid)


def _series_uid(data: bytes) -> str | None:
    """The top-level Series Instance UID in ``data`` (a Part 10 file's start), None if not all there."""
    try:
        from pydicom.filereader import read_partial  # lazily: the slides extra

        dataset = read_partial(
            _Header(data),
            stop_when=lambda tag, _vr, _length: tag > _SERIES_UID,
            defer_size=1024,  # a UID is at most 64 bytes: nothing larger is copied
            specific_tags=[_SERIES_UID],
        )
        element = dataset.get_item(_SERIES_UID)
        if element is None or element.value_tell + element.length > len(data):
            return None  # absent, or cut off (pydicom reads a short value without a word)
        uid = dataset.SeriesInstanceUID
    except Exception:  # pydicom on untrusted bytes (or none installed): "series unknown"
        return None
    return str(uid) if uid else None
