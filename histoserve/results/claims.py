"""One process per slide: atomic claims that die with their holder.

Two ``histoserve embed`` runs on one output folder (two shells, two pods of a
Job, a re-run started while the first still runs) must never embed the same
slide twice. Before embedding a slide a process takes an exclusive,
non-blocking ``fcntl.flock`` on ``<out>/.claims/<slide_id>.lock`` and keeps the
file open while it works. The kernel releases the lock when the holder exits
in any way, SIGKILL and OOM kill included, so the next run takes a dead
holder's claim over at once, with no timeout and no stale-lock heuristics.
The file also says who holds it (pid, host, time), for humans only.

Releasing unlinks the lock file while still holding the lock; a claimer that
opened the old file before the unlink notices after locking that the path now
names another file (or none) and tries again, so two processes can never both
believe they hold one slide.

Caveat: ``flock`` is only as good as the file system's lock support. Local
disks and NFSv4 (where ``flock`` maps to byte-range locks) work; NFSv3 without
a lock daemon, some FUSE mounts and object-store mounts silently grant every
lock. Put ``--out`` on a file system with working locks when several
processes share it. A lock is held per open file, so a forked child that
inherits the descriptor keeps the claim alive until it exits too.

The lock files never follow a symlink and never truncate anything but a
lock file of their own: ``.claims`` must be a real folder (not a symlink),
and is opened once per claim so every name inside is
looked up relative to that open folder (a ``.claims`` swapped for a symlink
meanwhile changes nothing); a lock name is opened with ``O_NOFOLLOW`` and
must be a regular file with one link. A symlink, folder or FIFO planted at
``.claims/<slide_id>.lock`` fails that slide (:class:`SlideError`, naming
the file), a bad ``.claims`` the run (:class:`UsageError`); neither is removed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time
from pathlib import Path
from types import TracebackType

from histoserve.errors import SlideError, UsageError
from histoserve.slides.manifest import check_slide_id

CLAIMS_DIR = ".claims"
_ATTEMPTS = 8  # re-tries when the lock file is replaced under us (release races)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted at the lock name never blocks the open.
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Claim:
    """A held claim on one slide; release it (or leave the ``with`` block) when done."""

    def __init__(self, fd: int, dir_fd: int, path: Path) -> None:
        """Wrap ``fd`` holding the lock on ``path``, named in the open folder ``dir_fd``.

        Both descriptors become this claim's (use ClaimStore).
        """
        self._fd: int | None = fd
        self._dir_fd = dir_fd
        self.path = path

    @property
    def held(self) -> bool:
        """Whether this claim is still held."""
        return self._fd is not None

    def release(self) -> None:
        """Give the slide up: unlink the lock file, then drop the lock. Idempotent."""
        import fcntl

        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path.name, dir_fd=self._dir_fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            os.close(self._dir_fd)

    def __enter__(self) -> Claim:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class ClaimStore:
    """Claims on the slides of one output folder (``<out>/.claims/``)."""

    def __init__(self, out_dir: Path) -> None:
        """Use ``out_dir/.claims`` (created if missing).

        Raises:
            UsageError: ``.claims`` is a symlink, not a folder, or cannot be created.
        """
        self.dir = Path(out_dir) / CLAIMS_DIR
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(_bad_dir(self.dir, f"cannot be created ({exc})")) from exc
        os.close(self._open_dir())

    def try_claim(self, slide_id: str) -> Claim | None:
        """Claim ``slide_id`` now, or return None when another live holder has it.

        Never waits: a claim held by a live process (this one included, through
        another Claim) is refused at once; one whose holder died is free.

        Raises:
            UsageError: ``slide_id`` is no plain file name, or ``.claims`` went bad.
            SlideError: The lock name is a symlink or no plain file of its own.
        """
        name = f"{check_slide_id(slide_id)}.lock"
        dir_fd = self._open_dir()
        try:
            fd = _lock(dir_fd, name, self.dir / name)
        except BaseException:
            os.close(dir_fd)
            raise
        if fd is None:
            os.close(dir_fd)
            return None
        return Claim(fd, dir_fd, self.dir / name)

    def _open_dir(self) -> int:
        """``.claims`` opened as a folder, never through a symlink.

        Its owner is not checked: NFS root-squash and pods of other uids share
        output folders, and nothing inside is ever opened through a symlink.
        """
        try:
            fd = os.open(self.dir, _DIR_FLAGS)
        except OSError as exc:
            what = "a symbolic link" if self.dir.is_symlink() else f"not a folder ({exc.strerror})"
            raise UsageError(_bad_dir(self.dir, f"is {what}")) from exc
        return fd


def _bad_dir(path: Path, why: str) -> str:
    return (
        f"claims folder {path} {why}: it must be a real folder, not a symbolic link; "
        "remove it, or give another --out"
    )


def _lock(dir_fd: int, name: str, path: Path) -> int | None:
    """The locked descriptor of ``dir_fd/name``, or None when a live holder has it."""
    import fcntl

    for _ in range(_ATTEMPTS):
        try:
            fd = os.open(name, _LOCK_FLAGS, 0o644, dir_fd=dir_fd)
        except OSError as exc:
            raise SlideError(_bad_lock(path, _what(dir_fd, name, exc))) from exc
        try:
            _check_lock_file(fd, path)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, dir_fd, name):
            try:
                _check_lock_file(fd, path, links=1)
                _write_owner(fd)
            except BaseException:
                os.close(fd)
                raise
            return fd
        # Released (unlinked) between our open and our lock: try the new file.
        os.close(fd)
    return None


def _check_lock_file(fd: int, path: Path, links: int | None = None) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise SlideError(_bad_lock(path, "is not a regular file"))
    if links is not None and st.st_nlink != links:
        raise SlideError(_bad_lock(path, f"has {st.st_nlink} hard links, not {links}"))


def _what(dir_fd: int, name: str, exc: OSError) -> str:
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return f"cannot be opened ({exc.strerror})"
    return "is a symbolic link" if stat.S_ISLNK(mode) else f"cannot be opened ({exc.strerror})"


def _bad_lock(path: Path, why: str) -> str:
    return (
        f"cannot claim the slide: its lock file {path} {why}; histoserve embed "
        "never writes through one and leaves it there: remove it and run again"
    )


def _same_file(fd: int, dir_fd: int, name: str) -> bool:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _write_owner(fd: int) -> None:
    text = f"pid={os.getpid()} host={socket.gethostname()} since={time.time():.0f}\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
