"""What a device holds and how busy it is, read for ``histoserve_device_*``.

One :class:`DeviceStatsReader` per device the server runs on, read by the
metrics' sampler thread (:class:`~predictor.model.metrics.DeviceSampler`):

- **CUDA**: torch's caching allocator (``memory_allocated``: tensors alive;
  ``memory_reserved``: what the allocator holds from the driver, the figure
  that runs out), the device's total from ``cudaMemGetInfo`` (read once), and
  the utilisation NVML reports for the whole GPU (every process on it) when
  ``pynvml`` (the ``nvidia-ml-py`` package) imports and the driver answers;
  otherwise no utilisation, never an error.
- **CPU**: the process's resident memory (``/proc/self/statm``) as both
  allocated and reserved, the memory it may use as total (the machine's, or
  the cgroup's ``memory.max`` when lower: a pod's limit), and as utilisation
  the share of the CPUs this process may run on that it used since the last
  read.

Every read is a few system calls: cheap enough for a sampler once a second,
never on a request's path.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")


@dataclass(frozen=True)
class DeviceStats:
    """One read of one device.

    Attributes:
        device: The device's name as the server uses it (``cpu``, ``cuda:0``).
        allocated_bytes: Bytes in live tensors (CPU: the resident set).
        reserved_bytes: Bytes the allocator holds (CPU: the resident set).
        total_bytes: The device's memory (CPU: the machine's or the cgroup limit).
        utilization_ratio: 0..1 busy since the last read; None where unknown
            (a GPU without NVML).
    """

    device: str
    allocated_bytes: int
    reserved_bytes: int
    total_bytes: int
    utilization_ratio: float | None


class DeviceStatsReader:
    """Reads :class:`DeviceStats` of one device (see the module docstring for the sources)."""

    def __init__(self, device: str | torch.device) -> None:
        self._device = torch.device(device)
        self.name = str(device)
        self._cuda = self._device.type == "cuda"
        self._total: int | None = None
        self._nvml: Any = None
        self._last_cpu: tuple[float, float] | None = None
        if self._cuda:
            self._nvml = _nvml_handle(self._device)

    def read(self) -> DeviceStats:
        """The device's memory now and its utilisation since the previous read."""
        if self._cuda:
            return self._read_cuda()
        return self._read_cpu()

    def _read_cuda(self) -> DeviceStats:
        index = self._device.index if self._device.index is not None else 0
        if self._total is None:
            self._total = int(torch.cuda.mem_get_info(index)[1])
        utilization = None
        if self._nvml is not None:
            nvml, handle = self._nvml
            try:
                utilization = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            except Exception:  # a driver that stops answering: the series goes, serving stays
                self._nvml = None
        return DeviceStats(
            self.name,
            int(torch.cuda.memory_allocated(index)),
            int(torch.cuda.memory_reserved(index)),
            self._total,
            utilization,
        )

    def _read_cpu(self) -> DeviceStats:
        resident = resident_bytes()
        if self._total is None:
            self._total = usable_memory_bytes()
        now = (time.monotonic(), time.process_time())
        utilization = 0.0
        if self._last_cpu is not None:
            wall = now[0] - self._last_cpu[0]
            used = now[1] - self._last_cpu[1]
            cpus = len(os.sched_getaffinity(0)) or 1
            utilization = min(1.0, max(0.0, used / (wall * cpus))) if wall > 0 else 0.0
        self._last_cpu = now
        return DeviceStats(self.name, resident, resident, self._total, utilization)


def resident_bytes() -> int:
    """This process's resident set size (``/proc/self/statm``'s second field, in pages)."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def usable_memory_bytes() -> int:
    """The machine's memory, or the cgroup (v2) limit when one is set and lower."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = _CGROUP_MEMORY_MAX.read_text(encoding="ascii").strip()
    except OSError:
        return physical
    return min(physical, int(limit)) if limit.isdigit() else physical


def _nvml_handle(device: torch.device) -> tuple[Any, Any] | None:
    """``(pynvml, handle)`` for ``device``, found by UUID (NVML ignores CUDA_VISIBLE_DEVICES); None without NVML."""
    try:
        import pynvml  # nvidia-ml-py: only on GPU hosts that install it

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(name)
    except Exception:  # no pynvml, no driver library, a MIG slice NVML cannot name
        return None
