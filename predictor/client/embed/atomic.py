"""Files written whole or not at all, under temp names no other process picks.

:func:`atomic_path` yields a fresh hidden temp file beside the final name
(created exclusively, never through a symlink), and after the caller has
written it: fsync, ``os.replace`` onto the final name (which replaces a
symlink there rather than following it), fsync of the folder. A crash leaves
the old state or a temp file; readers never see half a file.

Temp names carry a full uuid4 (:func:`temp_path`), never a PID: the pods of a
Kubernetes Job are all PID 1 and share the output volume. A killed run's temp
file is removed by the next run that claims the same slide
(:func:`remove_stale_temps`), since only the claim's holder may write it.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NAME_MAX_BYTES = 255
_TEMP_TAG = re.compile(r"[0-9a-f]{32}\.tmp")


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yields a fresh hidden temp file beside ``final``; renamed onto it (fsynced) if no error.

    The temp file (:func:`temp_path`) is created empty here, exclusively and
    without following a symlink (``O_CREAT | O_EXCL | O_NOFOLLOW``), so the
    caller (h5py, torch, PIL: they take a path) writes into a file this
    process made; it must still be that same regular file when it is
    renamed. ``os.replace`` replaces whatever ``final`` names, a symlink
    included, and never writes through it. The folder is created when
    missing; on any error the temp file is removed and ``final`` is untouched
    (a reader sees the old file or the new, never half).

    Raises:
        OSError: The folder cannot be written, or the temp file was replaced meanwhile.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(final)
    fd = os.open(tmp, _CREATE_FLAGS, 0o666)
    try:
        created = os.fstat(fd)
    finally:
        os.close(fd)
    try:
        yield tmp
        _fsync_path(tmp, (created.st_dev, created.st_ino))
        os.replace(tmp, final)
        _fsync_path(final.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def temp_path(final: Path) -> Path:
    """A hidden name beside ``final`` nobody else picks: ``.<name>.<uuid4 hex>.tmp``.

    A full random uuid4, not the PID: the pods of a Job are all PID 1 and
    share the output volume. The name part is cut (by bytes) so that the temp
    name fits the 255-byte file name limit whenever ``final``'s does.
    """
    return final.parent / f"{_temp_prefix(final.name)}{uuid.uuid4().hex}.tmp"


def _temp_prefix(name: str) -> str:
    """``.<name>.``, ``name`` cut so that a temp name (32 hex + ``.tmp`` more) fits."""
    room = _NAME_MAX_BYTES - len(".") - len(".") - 32 - len(".tmp")
    while len(os.fsencode(name)) > room:
        name = name[:-1]  # whole characters: no half of a UTF-8 sequence
    return f".{name}."


def remove_stale_temps(final: Path) -> int:
    """Removes the temp files :func:`temp_path` made for ``final`` by runs that died.

    Call it only while holding the slide's claim: then no live process is
    writing ``final``, and a killed run's temp (gigabytes for a big slide)
    does not stay behind forever. Matches ``.<name>.<32 hex>.tmp`` exactly, so
    another slide's temp is never taken for this one's. Returns how many went.
    """
    prefix = _temp_prefix(final.name)
    removed = 0
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(final.parent):
            tag = entry.name[len(prefix) :]
            stale = entry.name.startswith(prefix) and _TEMP_TAG.fullmatch(tag) is not None
            if stale and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
    return removed


def _fsync_path(path: Path, identity: tuple[int, int] | None = None) -> None:
    """fsyncs the file or folder at ``path``.

    With ``identity`` (``st_dev``, ``st_ino``) the path must name that very
    regular file, not a symlink or a file put there since (OSError otherwise).
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_NOFOLLOW if identity is not None else 0)
    fd = os.open(path, flags)
    try:
        if identity is not None:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != identity:
                raise OSError(f"temporary file {path} was replaced while being written")
        os.fsync(fd)
    finally:
        os.close(fd)
