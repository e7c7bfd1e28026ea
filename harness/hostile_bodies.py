"""Answer bodies a client must stop reading: too large, inflating, or too slow.

The bodies :class:`harness.bad_server.BadServer` sends for its ``huge``,
``unsized``, ``gzip`` and ``drip`` tampers: 512 MiB of zeros, a gzip bomb
that inflates to as much, a right answer one byte at a time.
"""

from __future__ import annotations

import functools
import time
import zlib
from dataclasses import dataclass
from typing import Any

HUGE_BYTES = 512 << 20
"""Bytes of the zeros body, and of the gzip bomb inflated."""


@dataclass(frozen=True)
class Stream:
    """A body sent piece by piece: ``chunks`` (an iterator of bytes), its ``length`` if declared."""

    chunks: Any
    length: int | None


def zeros(total: int) -> Any:
    """``total`` bytes of zeros, 1 MiB at a time."""
    block = bytes(1 << 20)
    for _ in range(total // len(block)):
        yield block


def drip(data: bytes, every_s: float) -> Any:
    """``data`` one byte every ``every_s`` seconds."""
    for i in range(len(data)):
        time.sleep(every_s)
        yield data[i : i + 1]


@functools.cache
def gzip_bomb() -> bytes:
    """512 MiB of zeros, gzip-compressed (about 0.5 MB); made once per process."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)  # 31: the gzip container
    block = bytes(1 << 20)
    parts = [packer.compress(block) for _ in range(HUGE_BYTES // len(block))]
    return b"".join(parts) + packer.flush()
