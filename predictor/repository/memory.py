"""What a loaded model's memory costs, and the budget the loaded models share.

A model's cost is measured as it loads: on a GPU the device memory in use
(``torch.cuda.mem_get_info``: every allocation, the caching allocator's and
the package's own) after its load less before; on the CPU the process's
resident set growth. Either is at least the size of the package file it
loaded (its weights must be somewhere, and a reload may reuse memory an
unload freed, which a growth would miss). Loads are one at a time, so one
load's growth is its own, up to what serving the other models allocates
meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from predictor.model.device_stats import resident_bytes, usable_memory_bytes

MIB = 1 << 20


def mib(n: int) -> str:
    """``n`` bytes as a short text in MiB."""
    return f"{n / MIB:.1f} MiB"


@dataclass
class Measured:
    """One load's measured cost (``bytes``, set when the load ends)."""

    bytes: int = 0


@dataclass(frozen=True)
class MemoryMeter:
    """Measures loads on ``device`` (the models' first device: every model shares it)."""

    device: torch.device

    def total_bytes(self) -> int:
        """The device's memory (CPU: the usable memory, the cgroup's limit when lower)."""
        if self.device.type == "cuda":
            return torch.cuda.mem_get_info(self.device)[1]
        return usable_memory_bytes()

    def used_bytes(self) -> int:
        """Memory in use now (GPU: the device's, every process's; CPU: this process's)."""
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            return total - free
        return resident_bytes()

    @contextmanager
    def measuring(self, at_least: int) -> Iterator[Measured]:
        """Measures the block's growth in use, at least ``at_least`` bytes."""
        measured = Measured()
        before = self.used_bytes()
        yield measured
        measured.bytes = max(self.used_bytes() - before, at_least)

    def release(self) -> None:
        """Hands memory an unloaded model freed back (GPU: the caching allocator's)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def smallest_package_bytes(folder: Path) -> int:
    """The smallest ``*.pt2`` in ``folder`` (0 if none): what its load costs at least."""
    sizes = [p.stat().st_size for p in folder.glob("*.pt2") if p.is_file()]
    return min(sizes, default=0)
