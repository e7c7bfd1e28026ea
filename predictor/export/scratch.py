"""Each export's own scratch folders: a fresh inductor cache and a staging folder, never reused.

``aoti_compile_and_package`` writes the generated code, the compiled kernels and
their metadata under inductor's cache folder at names derived from the code's
hash, then zips them into the package. A shared cache lets one export pick up
what another left: on the H200, a package built in a cache where an earlier
export had been killed at its deadline segfaulted on load. So every export
compiles in a cache of its own (:func:`fresh_inductor_cache`: torch's own
``fresh_cache``, which also clears inductor's in-memory caches, inside a folder
this export owns), removed when it ends, and stages its package in a folder of
its own beside the output (:func:`owned_dir`).

A killed export cannot remove its folders, and nothing ever reuses them: each
export makes new ones (``mkdtemp``). Each folder holds an ``.owner`` file its
export keeps ``flock``-ed; the kernel drops the lock when the process dies, so
the next export's :func:`sweep` removes exactly the folders whose owner is
gone. Folders are opened without following symlinks, and the cache root must be
a real folder of this user.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from predictor.errors import CheckpointError

OWNER = ".owner"
"""The lock file inside each owned folder."""
CACHE_ROOT = "histoserve-exports"
"""The folder, inside inductor's cache folder, that holds each export's own cache."""
_YOUNG_S = 60.0  # a folder without an owner file this young may be one being set up


@contextlib.contextmanager
def owned_dir(parent: Path, prefix: str) -> Iterator[Path]:
    """A new folder ``parent/<prefix>XXXXXXXX`` owned (locked) by this process, removed on exit.

    Folders of the same prefix whose owner died are removed first (:func:`sweep`).
    """
    parent.mkdir(parents=True, exist_ok=True)
    sweep(parent, prefix)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    fd = os.open(
        folder / OWNER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)


def sweep(parent: Path, prefix: str) -> list[Path]:
    """Removes ``parent``'s ``<prefix>*`` folders whose owner is gone; returns them.

    A folder whose ``.owner`` lock is free (its process died: the kernel
    released it) is removed; one still locked is in use and kept. Symlinks
    are never followed.
    """
    removed = []
    with os.scandir(parent) as entries:
        for entry in entries:
            mine = entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False)
            if mine and _owner_gone(Path(entry.path)):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(Path(entry.path))
    return removed


def _owner_gone(folder: Path) -> bool:
    try:
        fd = os.open(folder / OWNER, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:  # killed before it locked, or just being made
        return time.time() - folder.lstat().st_mtime > _YOUNG_S
    except OSError:  # a symlink or something else planted: leave it alone
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def cache_root() -> Path:
    """``<inductor cache folder>/histoserve-exports``: where each export's own cache goes.

    Raises:
        CheckpointError: It exists and is a symlink or another user's.
    """
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = Path(cache_dir()) / CACHE_ROOT
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = root.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
        raise CheckpointError(f"export cache folder {root} is a symlink or not this user's")
    return root


@contextlib.contextmanager
def fresh_inductor_cache() -> Iterator[Path]:
    """An inductor (and Triton) cache of this export's own, removed on exit.

    Inside, ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` point at it
    (child processes inherit them) and inductor's in-memory caches start empty.

    Yields:
        The cache folder.
    """
    from torch._inductor.utils import fresh_cache

    with owned_dir(cache_root(), "export-") as folder, fresh_cache(dir=str(folder)):
        yield Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
