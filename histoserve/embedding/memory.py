"""Keep the client's memory flat: large buffers go back to the OS when freed.

Every batch allocates a few ~10 MB buffers (tiles, the request body) from
several threads. glibc serves such sizes with ``mmap`` at first, but after the
first one is freed it raises its mmap threshold to that size (up to 32 MB), and
from then on they come from per-thread heap arenas that fragment and are never
returned: a 20,000-tile slide peaked at ~720 MiB resident where ~330 MiB were in
use. A fixed threshold turns the adjustment off (measured: peak ~340 MiB, most
of it the slide's own feature array). The extra page faults cost about a
millisecond per batch.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
DEFAULT_THRESHOLD_BYTES = 1 << 20


def large_buffers_use_mmap(threshold_bytes: int = DEFAULT_THRESHOLD_BYTES) -> bool:
    """Allocations of at least ``threshold_bytes`` always use ``mmap`` (glibc only).

    Process-wide and harmless elsewhere: returns False where there is no glibc
    ``mallopt`` (musl, macOS) and changes nothing then.
    """
    if threshold_bytes <= 0:
        raise ValueError(f"threshold_bytes must be > 0, got {threshold_bytes}")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold_bytes))
