"""The V2 binary layout's fixed parts: the header name, datatypes, ``BYTES`` length prefixes.

numpy only (see :mod:`histoserve.wire`).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import numpy as np

HEADER = "Inference-Header-Content-Length"
"""HTTP header carrying the JSON header's length in bytes."""

DATATYPES: Mapping[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
"""V2 numeric datatypes and their little-endian numpy dtypes (``BYTES`` is separate)."""

_PREFIX = struct.Struct("<I")

MAX_HEADER_DIGITS = 19
"""Longest header length text converted (any body is shorter than 10**19 bytes)."""


class WireError(ValueError):
    """A body, header value or tensor that breaks the V2 binary layout."""


def length_prefixed(items: Sequence[bytes]) -> bytes:
    """``BYTES`` raw data: each element a 4-byte little-endian length, then its bytes."""
    return b"".join(_PREFIX.pack(len(item)) + bytes(item) for item in items)


def split_length_prefixed(data: bytes | memoryview, count: int) -> list[bytes]:
    """The ``count`` elements of ``BYTES`` raw data, each kept as ``bytes`` (never text).

    Raises:
        WireError: A length prefix is cut short or overruns the data, or the
            data holds more or fewer than ``count`` elements.
    """
    view = memoryview(data).cast("B")
    total, offset, items = view.nbytes, 0, []
    while offset < total:
        if len(items) >= count:
            raise WireError(
                f"BYTES data holds more than the {count} elements of its shape "
                f"({total - offset} bytes left after them)"
            )
        if offset + 4 > total:
            raise WireError(
                f"BYTES element {len(items)}: length prefix cut short at byte {offset} of {total}"
            )
        (size,) = _PREFIX.unpack_from(view, offset)
        offset += 4
        if offset + size > total:
            raise WireError(
                f"BYTES element {len(items)}: length {size} overruns the "
                f"{total - offset} bytes left"
            )
        items.append(bytes(view[offset : offset + size]))
        offset += size
    if len(items) != count:
        raise WireError(f"shape [{count}] but BYTES data holds {len(items)} elements")
    return items
