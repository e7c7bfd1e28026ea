"""A two-file layout's pair, committed as one: the done file records its other file and checks it.

``--layout trident`` and ``clam`` write two files per slide; the done file is
renamed into place after the other one (its sibling) and records it
(:data:`SIBLINGS_ATTR`, JSON keyed by the sibling's path under ``--out``): its
SHA-256, and its size, mtime, ctime and inode once in place
(:func:`sibling_record`). A resume check (:func:`sibling_problem`) trusts a
sibling whose size, mtime, ctime and inode are still the recorded ones
without reading it, so resuming a cohort is a ``stat`` per slide rather than
a full read of every ``.pt``. Anything else is hashed and must have the
recorded digest: a file renamed over it (another inode), written in place
(another mtime and ctime, which no user can set back), an output folder
copied or moved to another file system (other inodes: hashed on every check,
still right). So a pair torn by a run killed between its two renames (one
run's sibling beside another run's done file) is never done.

Siblings are read as regular files only, never through a symlink and never
blocking on a FIFO (:func:`~histoserve.atomic.open_regular`).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from histoserve import jsonsafe
from histoserve.atomic import open_regular

SIBLINGS_ATTR = "sibling_sha256"  # the done file's record of the slide's other files
_STAT_KEYS = ("size", "mtime_ns", "ctime_ns", "ino")


def sibling_record(out_dir: Path, *siblings: Path) -> dict[str, str]:
    """The done file's record of ``siblings`` as they are now: ``{SIBLINGS_ATTR: JSON}``.

    Raises:
        OSError: A sibling cannot be read, or is no regular file.
    """
    return record_of(out_dir, {p: _digest_and_stat(p) for p in siblings})


def record_of(out_dir: Path, read: Mapping[Path, Mapping[str, Any]]) -> dict[str, str]:
    """The done file's record of files already digested as they were read (:func:`digest_open`).

    What a result derives from is recorded as it was read, not as it is when
    the result is written: a file renamed over it meanwhile is another file.
    """
    names = {p.relative_to(out_dir).as_posix(): dict(entry) for p, entry in read.items()}
    return {SIBLINGS_ATTR: json.dumps(names, sort_keys=True)}


def digest_open(handle: BinaryIO) -> dict[str, Any]:
    """``sha256`` of every byte of an open regular file and its stat keys; the offset back at 0."""
    handle.seek(0)
    st = os.fstat(handle.fileno())
    digest = hashlib.file_digest(handle, "sha256").hexdigest()
    handle.seek(0)
    return {"sha256": digest, **dict(zip(_STAT_KEYS, _stat_key(st), strict=True))}


def unchanged_since(handle: BinaryIO, entry: Mapping[str, Any]) -> bool:
    """Whether the open file still has the size, mtime, ctime and inode of ``entry``."""
    return _stat_key(os.fstat(handle.fileno())) == [entry.get(k) for k in _STAT_KEYS]


def sibling_problem(out_dir: Path, path: Path, attrs: Mapping[str, Any]) -> str:
    """Why ``path`` is not the file the done file's ``attrs`` recorded (``""``: it is)."""
    name = path.relative_to(out_dir).as_posix()
    try:
        recorded = jsonsafe.loads(attrs.get(SIBLINGS_ATTR) or "{}", SIBLINGS_ATTR)
    except (TypeError, ValueError):
        recorded = None
    entry = recorded.get(name) if isinstance(recorded, dict) else None
    if isinstance(entry, str):  # the first format: the digest alone
        entry = {"sha256": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        return f"the done file records no digest of {name} (an older histoserve wrote it)"
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and _stat_key(st) == [entry.get(k) for k in _STAT_KEYS]:
            return ""  # the very file recorded, untouched since: not read again
        digest = _digest_and_stat(path)["sha256"]
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror or exc})"
    if digest != entry["sha256"]:
        return (
            f"{name} is not the file its done file recorded "
            "(a run stopped between writing the two, or the file was replaced)"
        )
    return ""


def _digest_and_stat(path: Path) -> dict[str, Any]:
    """``sha256`` of every byte and the stat keys, from one descriptor of the regular file."""
    with open(open_regular(path), "rb") as handle:
        return digest_open(handle)


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
