"""GPU utilisation, SM clock, power and memory sampled during a measurement window.

``pynvml`` may not exist on the GPU machine, so the samples come from the
driver's own library through ``ctypes`` (``libnvidia-ml.so.1``: the
``nvmlDeviceGet*`` calls ``nvidia-smi`` makes), else from ``nvidia-smi
--query-gpu`` once per sample; on a machine with neither (the CPU dry run)
the window records ``{"source": "none"}``. Every call is guarded: a
sampler that fails never fails the measurement it watches.

Use::

    with GpuSampler() as sampler:
        ...  # the measured work
    figures = sampler.summary()  # util %, SM MHz, W, memory MiB: mean and max
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any

FIELDS = ("util_pct", "sm_mhz", "power_w", "memory_mib")
QUERY = "utilization.gpu,clocks.sm,power.draw,memory.used"
"""``nvidia-smi --query-gpu`` fields, in :data:`FIELDS`' order."""

Reader = Callable[[], tuple[float, ...] | None]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


def nvml_reader(index: int = 0) -> Reader | None:
    """A reader through ``libnvidia-ml.so.1`` for GPU ``index``; ``None`` when NVML cannot start."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            return None
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
            return None
    except (OSError, AttributeError):
        return None

    def read() -> tuple[float, ...] | None:
        util, mem = _Utilization(), _Memory()
        clock, power = ctypes.c_uint(), ctypes.c_uint()
        codes = (
            lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util)),
            lib.nvmlDeviceGetClockInfo(handle, ctypes.c_int(1), ctypes.byref(clock)),  # SM
            lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(power)),  # mW
            lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)),
        )
        if any(codes):
            return None
        return (float(util.gpu), float(clock.value), power.value / 1e3, mem.used / 2**20)

    return read


def parse_smi(line: str) -> tuple[float, ...] | None:
    """One ``nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`` line; ``None`` if unreadable."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != len(FIELDS):
        return None
    try:
        return tuple(float(p) for p in parts)
    except ValueError:
        return None


def smi_reader(index: int = 0, command: Sequence[str] | None = None) -> Reader | None:
    """A reader running ``nvidia-smi`` once per sample; ``None`` without ``nvidia-smi``."""
    if command is None:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return None
        command = [smi, f"--id={index}", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]

    def read() -> tuple[float, ...] | None:
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=5, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return parse_smi(out.stdout.splitlines()[0]) if out.stdout.strip() else None

    return read


class GpuSampler:
    """Samples one GPU every ``period_s`` in a thread while its ``with`` block runs.

    Args:
        reader: Where samples come from; default NVML through ctypes, else
            ``nvidia-smi``, else none.
        period_s: Seconds between samples.
    """

    def __init__(self, reader: Reader | None = None, period_s: float = 0.2) -> None:
        self.source = "injected" if reader is not None else "none"
        if reader is None:
            reader = nvml_reader()
            self.source = "nvml" if reader is not None else "none"
        if reader is None:
            reader = smi_reader()
            self.source = "nvidia-smi" if reader is not None else "none"
        self._read = reader
        self._period = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples: list[tuple[float, ...]] = []

    def __enter__(self) -> GpuSampler:
        if self._read is not None:
            self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self._read() if self._read is not None else None
            except Exception:
                sample = None
            if sample is not None:
                self.samples.append(sample)
            self._stop.wait(self._period)

    def summary(self) -> dict[str, Any]:
        """Mean and max of each field over the window's samples, and how many there were."""
        out: dict[str, Any] = {"source": self.source, "samples": len(self.samples)}
        for i, name in enumerate(FIELDS):
            values = [s[i] for s in self.samples]
            if values:
                out[f"{name}_mean"] = sum(values) / len(values)
                out[f"{name}_max"] = max(values)
        return out
