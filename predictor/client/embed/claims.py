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
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from predictor.client.embed.manifest import check_slide_id

CLAIMS_DIR = ".claims"
_ATTEMPTS = 8  # re-tries when the lock file is replaced under us (release races)


class Claim:
    """A held claim on one slide; release it (or leave the ``with`` block) when done."""

    def __init__(self, fd: int, path: Path) -> None:
        """Wrap an open descriptor ``fd`` holding the lock on ``path`` (use ClaimStore)."""
        self._fd: int | None = fd
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
                os.unlink(self.path)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

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
        """Use ``out_dir/.claims`` (created if missing)."""
        self.dir = Path(out_dir) / CLAIMS_DIR
        self.dir.mkdir(parents=True, exist_ok=True)

    def try_claim(self, slide_id: str) -> Claim | None:
        """Claim ``slide_id`` now, or return None when another live holder has it.

        Never waits: a claim held by a live process (this one included, through
        another Claim) is refused at once; one whose holder died is free.
        """
        import fcntl

        path = self.dir / f"{check_slide_id(slide_id)}.lock"
        for _ in range(_ATTEMPTS):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            if _same_file(fd, path):
                _write_owner(fd)
                return Claim(fd, path)
            # Released (unlinked) between our open and our lock: try the new file.
            os.close(fd)
        return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _write_owner(fd: int) -> None:
    text = f"pid={os.getpid()} host={socket.gethostname()} since={time.time():.0f}\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
