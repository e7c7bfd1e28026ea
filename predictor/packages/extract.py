"""One member of a ``.pt2`` zip written to a file, its CRC-32 checked over the written bytes.

The GIL-free runner (:mod:`predictor.runtime.aoti_runner`) ``dlopen``\\ s the
model library it extracts, so what is checked is the file that will be
loaded, not the archive it came from: a fault between the two (a short or
bad copy, a filesystem error) is refused before any of its code runs.
"""

from __future__ import annotations

import mmap
import os
import shutil
import zipfile
import zlib
from pathlib import Path
from typing import Any

__all__ = ["extract_member", "find_member"]

_CRC_CHUNK = 1 << 26


def find_member(names: list[str], model_name: str, suffix: str, path: Path) -> str:
    """The one zip member ``*/data/aotinductor/<model_name>/*<suffix>`` (wrapper first).

    Raises:
        ValueError: None, or several, naming ``path`` and what was found.
    """
    folder = f"data/aotinductor/{model_name}/"
    found = [n for n in names if folder in n and n.endswith(suffix)]
    wrapper = [n for n in found if "wrapper" in n.rsplit("/", 1)[-1]]
    found = wrapper or found
    if len(found) != 1:
        raise ValueError(
            f"{path}: expected one {folder}*{suffix} in the package, found {len(found)}: {found}"
        )
    return found[0]


def extract_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    """Writes one member of ``archive`` (opened from a file) to ``target``, then checks
    the CRC-32 of ``target``'s bytes against the archive's record.

    torch stores a package's library uncompressed; such a member is copied by
    the kernel (``os.copy_file_range``: no Python buffers; a 2.2 GB ViT-g
    ``.so`` took 1.3-2.4 s here against 7-9 s through :mod:`zipfile`). A
    compressed member, or a kernel without the call, goes through
    :mod:`zipfile`. Either way the CRC-32 is computed over the extracted
    file (from the page cache, just written), so the bytes checked are the
    bytes ``dlopen`` will map.

    Raises:
        zipfile.BadZipFile: The extracted bytes do not match the member's
            CRC-32 or size, or the archive ends inside the member.
    """
    if not (info.compress_type == zipfile.ZIP_STORED and _copy_stored(archive, info, target)):
        with archive.open(info) as member, target.open("wb") as dst:
            shutil.copyfileobj(member, dst, 1 << 22)
    with target.open("rb") as written:
        size = os.fstat(written.fileno()).st_size
        if size != info.file_size:
            raise zipfile.BadZipFile(
                f"extracted {info.filename!r} has {size} bytes, the archive records "
                f"{info.file_size}"
            )
        if _crc32(written.fileno(), 0, size) != info.CRC:
            raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r} (extracted bytes)")


def _copy_stored(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> bool:
    """Copies a stored member in the kernel; ``False`` when the call is unavailable here."""
    if not hasattr(os, "copy_file_range"):
        return False
    with open(str(archive.filename), "rb") as src, target.open("wb") as dst:
        offset = _data_offset(src, info)
        try:
            _copy_range(src.fileno(), dst.fileno(), offset, info.file_size)
        except OSError:
            dst.truncate(0)  # e.g. a filesystem without the call: zipfile copies it
            return False
    return True


def _data_offset(fh: Any, info: zipfile.ZipInfo) -> int:
    """Where a member's bytes start: after its local header, name and extra field."""
    fh.seek(info.header_offset)
    header = fh.read(30)
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"bad local header for {info.filename!r}")
    name_len, extra_len = (
        int.from_bytes(header[26:28], "little"),
        int.from_bytes(header[28:30], "little"),
    )
    return info.header_offset + 30 + name_len + extra_len


def _copy_range(src: int, dst: int, offset: int, size: int) -> None:
    done = 0
    while done < size:
        copied = os.copy_file_range(src, dst, size - done, offset + done, done)
        if copied == 0:
            raise zipfile.BadZipFile("the archive ends inside a member (truncated)")
        done += copied


def _crc32(fd: int, offset: int, size: int) -> int:
    """CRC-32 of ``size`` bytes of ``fd`` from ``offset``, through a read-only mapping."""
    if size == 0:
        return 0
    crc = 0
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            for start in range(offset, offset + size, _CRC_CHUNK):
                crc = zlib.crc32(view[start : min(start + _CRC_CHUNK, offset + size)], crc)
        finally:
            view.release()
    return crc
