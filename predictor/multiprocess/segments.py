"""Shared-memory segments in ``/dev/shm``: allocated for real, locked while used, swept when stale.

A slab (:mod:`predictor.multiprocess.shm`) lives in one segment, a file of the
tmpfs at :data:`SHM_DIR` named ``histoserve-slab-<uuid4 hex>``:

- **allocated at creation** with ``posix_fallocate``: a ``/dev/shm`` too small
  fails the pod's start-up naming the size (:class:`ShmTooSmall`) instead of a
  SIGBUS in the middle of a request when a page is first touched;
- **locked while used**: the creating process holds a shared ``flock`` on it
  until it closes it (the kernel drops the lock when the process dies, however
  it dies);
- **swept at start**: a pod's ``/dev/shm`` outlives container restarts and an
  OOM kill leaves segments behind; :func:`remove_stale_segments` unlinks every
  one of ours that nobody holds locked.

Opened with ``O_NOFOLLOW`` and created with ``O_EXCL``: a link planted in
``/dev/shm`` is never followed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

from predictor.errors import StartupError

SHM_DIR = Path("/dev/shm")
PREFIX = "histoserve-slab-"
_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


class ShmTooSmall(StartupError):
    """The shared-memory filesystem cannot hold the slabs."""


@dataclass
class Segment:
    """One mapped segment.

    Attributes:
        name: Its file name in the folder (what the other side attaches).
        buf: The mapping (a writable buffer).
        fd: The locked file (creator) or ``-1`` (attached).
        path: Its path.
    """

    name: str
    buf: mmap.mmap
    fd: int
    path: Path

    @classmethod
    def create(cls, size: int, folder: Path = SHM_DIR) -> Segment:
        """A new segment of ``size`` bytes, every page allocated, locked by this process.

        Raises:
            ShmTooSmall: The filesystem cannot hold ``size`` more bytes.
        """
        try:
            name, path, fd = _create_locked(folder)
        except OSError as exc:
            raise StartupError(
                f"cannot create a shared-memory segment in {folder}: {exc.strerror}"
            ) from exc
        try:
            os.posix_fallocate(fd, 0, size)
            buf = mmap.mmap(fd, size)
        except OSError as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
                raise ShmTooSmall(
                    f"{folder} cannot hold a shared-memory slab of {size} bytes "
                    f"({size / 2**20:.0f} MiB; {exc.strerror}): give the pod a larger /dev/shm "
                    "(the chart's shm.sizeLimit) or lower --frontends or --max_queue_size"
                ) from exc
            raise
        return cls(name, buf, fd, path)

    @classmethod
    def attach(cls, name: str, folder: Path = SHM_DIR) -> Segment:
        """Maps the existing segment ``name`` (never creates, never follows a link).

        Raises:
            ValueError: ``name`` is not one of ours.
            OSError: It does not exist.
        """
        if not name.startswith(PREFIX) or "/" in name:
            raise ValueError(f"not a histoserve segment name: {name!r}")
        path = folder / name
        fd = os.open(path, _OPEN)
        try:
            buf = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        return cls(name, buf, -1, path)

    def close(self, *, unlink: bool) -> None:
        """Unmaps (unless a view still holds the mapping), then unlinks and unlocks."""
        with contextlib.suppress(BufferError):
            self.buf.close()
        if unlink:
            self.path.unlink(missing_ok=True)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _create_locked(folder: Path) -> tuple[str, Path, int]:
    """A new empty segment file holding our shared lock.

    A sweep of another process may take and unlink the file between its
    creation and our lock: then the name no longer leads to our file, and a
    fresh name is tried.
    """
    while True:
        name = f"{PREFIX}{uuid.uuid4().hex}"
        path = folder / name
        fd = os.open(path, _OPEN | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return name, path, fd
        except FileNotFoundError:
            pass
        os.close(fd)


def remove_stale_segments(folder: Path = SHM_DIR) -> list[str]:
    """Unlinks every ``histoserve-slab-*`` segment in ``folder`` that no process holds locked.

    Returns:
        The names removed.
    """
    removed: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        names = [n for n in os.listdir(folder) if n.startswith(PREFIX)]
        for name in names:
            if _unlink_if_unheld(folder / name):
                removed.append(name)
    return removed


def _unlink_if_unheld(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False  # gone, or a link: not ours to touch
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False  # a folder or a device: not a segment of ours
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink(missing_ok=True)
    except OSError:  # BlockingIOError: a live owner holds it
        return False
    else:
        return True
    finally:
        os.close(fd)
