"""One AOTInductor compilation at a time per inductor cache folder.

``aoti_compile_and_package`` writes its generated files (the wrapper, the
kernels, ``<hash>.wrapper_metadata.json``) under inductor's cache folder at
names derived from the code's hash, then zips them. Two processes exporting the
same model at once (``make serve`` beside a test, two Jobs on one node) write
and read the very same files: one packaged a metadata file the other had just
truncated, and the package would not load. An exclusive ``flock`` on a file in
that folder serialises the compilations; the kernel releases it when the
process dies, so a killed export never blocks the next.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from torch._inductor.runtime.cache_dir_utils import cache_dir

LOCK_NAME = "histoserve-export.lock"


@contextlib.contextmanager
def inductor_cache_lock() -> Iterator[Path]:
    """Holds an exclusive lock on ``<inductor cache>/histoserve-export.lock``.

    The lock file is opened without following a symlink and never truncated.

    Yields:
        The lock file's path.
    """
    folder = Path(cache_dir())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)
