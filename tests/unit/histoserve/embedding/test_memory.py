"""large_buffers_use_mmap: glibc takes the setting; freed big buffers leave the process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from histoserve.embedding.memory import large_buffers_use_mmap

_PROBE = """
import sys, threading
from histoserve.embedding.memory import large_buffers_use_mmap
if sys.argv[1] == "on":
    assert large_buffers_use_mmap()
def rss():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS")][0].split()[1])
keep = []
def churn(seed):
    import random
    rng, held = random.Random(seed), []
    for i in range(80):  # 2-12 MB buffers freed out of order, small objects kept between them
        held.append(bytearray(rng.randrange(2_000_000, 12_000_000)))
        keep.append(bytearray(rng.randrange(64, 4096)))
        if len(held) > 3:
            held.pop(rng.randrange(len(held)))
before = rss()
threads = [threading.Thread(target=churn, args=(s,)) for s in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print((rss() - before) // 1024)
"""


def _growth_mib(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt, /proc")
def test_freed_large_buffers_go_back_to_the_os() -> None:
    assert large_buffers_use_mmap()
    # Without the setting this probe keeps ~90 MiB (run it with "off"); with it, none.
    assert _growth_mib("on") < 20


def test_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="threshold_bytes must be > 0, got 0"):
        large_buffers_use_mmap(0)
