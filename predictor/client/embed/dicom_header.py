"""The Series Instance UID of a DICOM file, read from its first bytes without a DICOM library.

A scanner's export folder holds the files of many slides; OpenSlide (libdicom)
reads a slide as the files of one series, the ones sharing the Series
Instance UID ``(0020,000E)`` of the file it is given. A slide's identity
(:mod:`~predictor.client.embed.identity`) must cover those files and no
others, so adding slide B to the folder does not re-embed slide A.

:func:`read_series` reads a Part 10 file's meta header (always explicit VR
little endian) for its transfer syntax, then walks the data set's top-level
elements in tag order, skipping values and sequences (of defined or
undefined length, any depth), until ``(0020,000E)``. Explicit and implicit VR
little endian are read (every WSI transfer syntax: JPEG, JPEG 2000 and the
like encode the data set explicit little endian); big endian, deflated data
sets and anything malformed give "unknown". At most the first
:data:`MAX_HEADER_BYTES` are read: the UID comes long before the pixels.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

MAX_HEADER_BYTES = 1 << 20
_FIRST_READ = 64 << 10
_PREAMBLE, _MAGIC = 128, b"DICM"
_SERIES_UID = (0x0020, 0x000E)
_TRANSFER_SYNTAX = (0x0002, 0x0010)
_IMPLICIT_LE = "1.2.840.10008.1.2"
_UNREADABLE = ("1.2.840.10008.1.2.2", "1.2.840.10008.1.2.1.99")  # big endian, deflated
_LONG_VRS = frozenset(b"OB OD OF OL OV OW SQ SV UC UN UR UT UV".split())
_UNDEFINED = 0xFFFFFFFF
_ITEM_GROUP = 0xFFFE
_ITEM, _SEQUENCE_END = 0xE000, 0xE0DD


@dataclass(frozen=True)
class DicomFile:
    """A DICOM Part 10 file's series: ``series_uid`` None when it cannot be read."""

    series_uid: str | None


class _Short(Exception):
    """The header goes on past the bytes read."""


def read_series(fd: int) -> DicomFile | None:
    """The file open at ``fd`` as DICOM (its series), or None when it is no DICOM Part 10 file.

    Raises:
        OSError: The file cannot be read.
    """
    size = _FIRST_READ
    while True:
        data = os.pread(fd, size, 0)
        if data[_PREAMBLE : _PREAMBLE + len(_MAGIC)] != _MAGIC:
            return None
        try:
            return DicomFile(_series_uid(data))
        except _Short:
            if len(data) < size or size >= MAX_HEADER_BYTES:
                return DicomFile(None)
            size = MAX_HEADER_BYTES
        except (struct.error, ValueError):
            return DicomFile(None)


def _series_uid(data: bytes) -> str | None:
    pos, syntax = _PREAMBLE + len(_MAGIC), ""
    while True:  # the meta group: explicit VR little endian, whatever the data set's syntax
        if pos + 2 > len(data):
            raise _Short
        if struct.unpack_from("<H", data, pos)[0] != 0x0002:
            break
        group, element, _vr, length, value = _element(data, pos, implicit=False)
        if (group, element) == _TRANSFER_SYNTAX:
            syntax = _text(data, value, length)
        pos = value + length
    if syntax in _UNREADABLE or not syntax:
        return None
    return _walk(data, pos, implicit=syntax == _IMPLICIT_LE)


def _walk(data: bytes, pos: int, implicit: bool) -> str | None:
    """Top-level elements from ``pos`` until the series UID (None: absent or unreadable)."""
    depth = 0
    while True:
        group, element, vr, length, value = _element(data, pos, implicit)
        if group == _ITEM_GROUP:  # an item (its elements follow when undefined) or a delimiter
            if element == _SEQUENCE_END:
                depth -= 1
                if depth < 0:
                    return None
            defined_item = element == _ITEM and length != _UNDEFINED
            pos = value + (length if defined_item else 0)
            continue
        if depth == 0 and (group, element) >= _SERIES_UID:
            return _text(data, value, length) if (group, element) == _SERIES_UID else None
        if length == _UNDEFINED:
            if vr not in (b"SQ", None):  # UN of undefined length: implicit inside, not followed
                return None
            depth, pos = depth + 1, value
            continue
        pos = value + length


def _element(data: bytes, pos: int, implicit: bool) -> tuple[int, int, bytes | None, int, int]:
    """``(group, element, VR or None, value length, value offset)`` of the element at ``pos``."""
    if pos + 8 > len(data):
        raise _Short
    group, element = struct.unpack_from("<HH", data, pos)
    if implicit or group == _ITEM_GROUP:
        return group, element, None, struct.unpack_from("<I", data, pos + 4)[0], pos + 8
    vr = data[pos + 4 : pos + 6]
    if not vr.isalpha() or not vr.isupper():
        raise ValueError("not an explicit VR")
    if vr in _LONG_VRS:
        if pos + 12 > len(data):
            raise _Short
        return group, element, vr, struct.unpack_from("<I", data, pos + 8)[0], pos + 12
    return group, element, vr, struct.unpack_from("<H", data, pos + 6)[0], pos + 8


def _text(data: bytes, value: int, length: int) -> str:
    if value + length > len(data):
        raise _Short
    return data[value : value + length].rstrip(b"\0 ").decode("ascii", "replace")
