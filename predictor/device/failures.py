"""How the batcher should treat a failed forward: split it, fail the batch, or give up the device.

The batcher wraps the failure (:func:`predictor.errors.forward_failure`);
nothing here does, except :func:`counting_ooms`, which turns a failure during
which the CUDA allocator counted an out-of-memory into one that
:func:`classify_error` sees as OOM, and :func:`reclassified`, which turns a
batch failure after which the device no longer synchronises into
:class:`~predictor.errors.DeviceLost`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch

from predictor.errors import DeviceLost, ErrorKind

# Messages of CUDA errors after which the context is unusable until restart
# (CUDA's "sticky" errors). "device not ready" (cudaErrorNotReady) is not one:
# it only says work is still pending.
_STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "invalid program counter",
    "hardware stack error",
    "launch timed out",
    "uncorrectable ecc",
    "cudaerrorlaunchfailure",
)

# Allocation failures of the libraries a package calls: out of memory, split
# the batch. cuDNN 9 names them ..._HOST_ALLOCATION_FAILED / ..._DEVICE_ALLOCATION_FAILED.
_ALLOCATION_FAILURES = (
    "out of memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "allocation_failed",
    "cudaerrormemoryallocation",
)

MemoryStats = Callable[[torch.device], Mapping[str, int]]
"""``torch.cuda.memory_stats``'s shape: a device's allocator counters."""

DeviceSync = Callable[[torch.device], None]
"""Waits for every stream of a device (``torch.cuda.synchronize``); raises its error."""


def cuda_memory_stats(device: torch.device) -> Mapping[str, int]:
    """The CUDA allocator's counters for ``device``; empty off CUDA."""
    return torch.cuda.memory_stats(device) if device.type == "cuda" else {}


def cuda_synchronize(device: torch.device) -> None:
    """``torch.cuda.synchronize(device)`` on CUDA; nothing elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class OomCounter:
    """Each device's allocator OOM count (``num_ooms``), read at start and after failures only.

    ``torch.cuda.memory_stats`` builds a dict of hundreds of keys: reading it
    around every forward costs more than the check is worth. The count is
    read once when a worker is built (:meth:`prime`) and again only after a
    forward failed (:meth:`rose`), which also moves the mark.
    """

    def __init__(self, memory_stats: MemoryStats = cuda_memory_stats) -> None:
        self._stats = memory_stats
        self._seen: dict[str, int | None] = {}
        self._lock = threading.Lock()

    def prime(self, device: torch.device) -> None:
        """Reads ``device``'s count as the mark, once per device."""
        with self._lock:
            if str(device) not in self._seen:
                self._seen[str(device)] = self._stats(device).get("num_ooms")

    def mark(self, device: torch.device) -> None:
        """Reads ``device``'s count as the mark again (after the warm-up, say)."""
        now = self._stats(device).get("num_ooms")
        with self._lock:
            self._seen[str(device)] = now

    def rose(self, device: torch.device) -> int:
        """OOMs counted on ``device`` since the mark (0 without a count); moves the mark."""
        now = self._stats(device).get("num_ooms")
        with self._lock:
            before = self._seen.get(str(device))
            self._seen[str(device)] = now
        if now is None or before is None:
            return 0
        return max(0, now - before)


@contextmanager
def counting_ooms(device: torch.device, counter: OomCounter) -> Iterator[None]:
    """Re-raises a failure as ``torch.OutOfMemoryError`` when the allocator counted an OOM during it.

    Inside a ``.pt2`` package an allocation failure does not surface as an
    OOM: the AOTInductor shim keeps the allocator's message in a
    thread-local and the generated code throws only
    ``aoti_torch_empty_strided(...) API call failed at <file>, line N``. The
    allocator's own counter (``num_ooms``) tells: read after a failure
    (never before a forward: :class:`OomCounter`), a rise since the last
    read means this batch ran out of memory, so the batcher splits it. (The
    counter is per device: with several workers on one GPU a sibling's OOM
    in the same window counts too, and a split of a batch that did not need
    it is harmless.)
    """
    try:
        yield
    except Exception as exc:
        rise = counter.rose(device)
        if not rise or classify_error(exc) is not ErrorKind.BATCH:
            raise
        raise torch.OutOfMemoryError(
            f"out of memory on {device} (the allocator counted {rise} OOM(s) "
            f"during this forward): {exc}"
        ) from exc


def reclassified(device: torch.device, exc: Exception, sync: DeviceSync) -> Exception:
    """``exc``, or :class:`DeviceLost` when a device sync after this non-OOM failure fails.

    A sticky CUDA error inside a package surfaces as the shim's
    ``API call failed`` (CUDA's own text goes to stderr only), which reads
    as a batch failure; the device would be taken out one batch late. So
    after a batch failure on a GPU the whole device is synchronised: if
    that raises too, the context is broken and this batch's error says so.
    """
    if device.type == "cpu" or classify_error(exc) is not ErrorKind.BATCH:
        return exc
    try:
        sync(device)
    except Exception as sticky:
        lost = DeviceLost(f"{device} is unusable after this batch failed ({sticky}): {exc}")
        lost.__cause__ = exc
        return lost
    return exc


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def classify_error(exc: BaseException) -> ErrorKind:
    """How the batcher should treat a forward failure: split, fail batch, or give up the device."""
    for err in _chain(exc):
        if isinstance(err, DeviceLost):
            return ErrorKind.FATAL
        if isinstance(err, torch.cuda.OutOfMemoryError):
            return ErrorKind.OOM
        text = str(err).lower()
        if any(marker in text for marker in _ALLOCATION_FAILURES):
            return ErrorKind.OOM
        if any(marker in text for marker in _STICKY_CUDA_ERRORS):
            return ErrorKind.FATAL
    return ErrorKind.BATCH
