"""The output folder's settings record, held by every run writing into it.

``<out>/.histoserve-run.json`` records the settings a folder's files are
made with: ``{"format": 1, "settings": {...}, "histoserve_version": ...}``
(``settings``: :func:`~histoserve.embedding.settings.run_settings`). A run
calls :func:`hold_folder` before any slide and keeps what it returns until
it ends:

- no record: the folder's done files are checked first (the caller's
  ``check_unrecorded``: a folder made by a histoserve before the record is
  adopted when they agree), then the record is written whole to a temp file
  and published with ``os.link``, which fails when another run published one
  first (then that one is read as below);
- a record: read under a shared ``fcntl.flock`` and compared; equal settings
  go on, holding the shared lock for the run's lifetime (runs with equal
  settings share a folder, the slides split by claims,
  :mod:`~histoserve.results.claims`); other settings are a
  :class:`~histoserve.errors.UsageError` naming each difference;
- ``--force`` with other settings (or an unreadable record): the record is
  replaced, only under an exclusive lock taken without waiting, i.e. when no
  other run holds the folder; else a UsageError. The new record is renamed
  over the old one while the old one is locked exclusively, so a run that
  opened the old one finds, once it has the lock, that the name now holds
  another file, and reads that.

The lock is the kernel's: a killed run's hold ends with it. Nothing is
ever written into an existing record (it is replaced whole), and it is opened
without following a symlink or blocking on a FIFO; a symlink, FIFO, folder,
or a record that is empty, over 64 KiB, not JSON, or of an unknown format is
a UsageError naming it (``--force`` replaces the last four). ``flock``
needs a file system with working locks, as claims do.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from histoserve import __version__, jsonsafe
from histoserve.atomic import NotRegularFile, open_regular, temp_path
from histoserve.errors import UsageError

RUN_FILE = ".histoserve-run.json"
FORMAT = 1
_MAX_BYTES = 64 * 1024
_ATTEMPTS = 8  # the record replaced under us (a --force run) before we held it
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class FolderHold:
    """A run's shared hold on its ``--out``; ends with :meth:`release` or the process."""

    def __init__(self, fd: int, path: Path) -> None:
        """Own ``fd``, the record at ``path`` opened and locked shared (use :func:`hold_folder`)."""
        self._fd: int | None = fd
        self.path = path

    def release(self) -> None:
        """Drops the hold (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> FolderHold:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def hold_folder(
    out_dir: Path,
    settings: Mapping[str, Any],
    differences: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]],
    check_unrecorded: Callable[[], None],
    *,
    force: bool = False,
) -> FolderHold:
    """Holds ``out_dir`` for a run with ``settings`` (see the module docstring).

    ``differences(old, new)``: one line per setting that differs (none: equal).
    ``check_unrecorded()``: raises UsageError when the folder, having no
    record, holds files made otherwise (not called with ``force``).

    Raises:
        UsageError: Other settings (each difference named) without ``force``; a
            record held by another run with ``force``; a bad record.
    """
    import fcntl

    path = Path(out_dir) / RUN_FILE
    for _ in range(_ATTEMPTS):
        fd = _open_record(path)
        if fd is None:
            if not force:
                check_unrecorded()
            created = _publish(path, settings, replace=False)
            if created is not None:
                return FolderHold(created, path)
            continue  # another run published one first: read it
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # an exclusive holder only swaps the file
            if not _same_file(fd, path):
                os.close(fd)
                continue
            recorded, problem = _parse(fd, path)
            diff = [problem] if problem else differences(recorded, settings)
            if not diff:
                return FolderHold(fd, path)
            if not force:
                raise UsageError(_other_settings(out_dir, path, diff, bool(problem)))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UsageError(_held(out_dir, path)) from None
            replaced = _publish(path, settings, replace=True)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the old record's exclusive lock: waiting runs now find the new one
        assert replaced is not None
        return FolderHold(replaced, path)
    raise UsageError(f"{path} kept being replaced by other runs; run again")


def _open_record(path: Path) -> int | None:
    try:
        return open_regular(path)
    except FileNotFoundError:
        return None
    except NotRegularFile as exc:
        raise UsageError(f"{exc}: the settings record of --out; remove it") from exc
    except OSError as exc:
        raise UsageError(f"{path} (the settings record of --out) cannot be read: {exc}") from exc


def _parse(fd: int, path: Path) -> tuple[dict[str, Any], str]:
    """The recorded settings, or ``({}, why the record is unreadable)``."""
    data = os.pread(fd, _MAX_BYTES + 1, 0)
    if not data:
        return {}, f"{path} is empty"
    if len(data) > _MAX_BYTES:
        return {}, f"{path} is over {_MAX_BYTES:,} bytes"
    try:
        record = jsonsafe.loads(data, str(path), max_bytes=_MAX_BYTES)
    except jsonsafe.JsonError as exc:
        return {}, str(exc)
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        return {}, f"{path} has no settings object"
    if record.get("format") != FORMAT:
        return {}, f"{path} has format {record.get('format')!r}, this histoserve reads {FORMAT}"
    return record["settings"], ""


def _publish(path: Path, settings: Mapping[str, Any], *, replace: bool) -> int | None:
    """Writes the record whole, locked shared, then links (or with ``replace`` renames) it
    into place; None when ``link`` found a record already there."""
    import fcntl

    record = {
        "format": FORMAT,
        "settings": dict(settings),
        "histoserve_version": __version__,
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    data = (json.dumps(record, indent=1, sort_keys=True, default=str) + "\n").encode()
    tmp = temp_path(path)
    try:
        fd = os.open(tmp, _CREATE, 0o644)
    except OSError as exc:
        raise UsageError(f"{path} (the settings record of --out) cannot be written: {exc}") from exc
    try:
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
        fcntl.flock(fd, fcntl.LOCK_SH)  # before anyone can see it
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path, follow_symlinks=False)
            except FileExistsError:
                os.close(fd)
                return None
        _sync_folder(path.parent)
    except OSError as exc:
        os.close(fd)
        raise UsageError(f"{path} (the settings record of --out) cannot be written: {exc}") from exc
    except BaseException:
        os.close(fd)
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return fd


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _other_settings(out_dir: Path, path: Path, diff: list[str], unreadable: bool) -> str:
    if unreadable:
        return (
            f"{diff[0]}: the settings record of --out {out_dir} cannot be read; remove it "
            "(the files are checked against this run's settings then), give another --out, "
            "or pass --force to record this run's settings and embed every slide again"
        )
    return (
        f"--out {out_dir} was made with other settings ({path}): {'; '.join(diff)} "
        "(recorded -> this run). Give another --out for these settings, or pass --force "
        "to embed every slide again with them (the folder then records them)"
    )


def _held(out_dir: Path, path: Path) -> str:
    return (
        f"--force: another histoserve embed is writing into --out {out_dir} with the settings "
        f"{path} records; wait for it to end, or give another --out"
    )
