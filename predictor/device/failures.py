"""How the batcher should treat a failed forward: split it, fail the batch, or give up the device.

The batcher wraps the failure (:func:`predictor.errors.forward_failure`);
nothing here does, except :func:`counting_ooms`, which turns a failure during
which the CUDA allocator counted an out-of-memory into one that
:func:`classify_error` sees as OOM.
"""

from __future__ import annotations

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

MemoryStats = Callable[[torch.device], Mapping[str, int]]
"""``torch.cuda.memory_stats``'s shape: a device's allocator counters."""


def cuda_memory_stats(device: torch.device) -> Mapping[str, int]:
    """The CUDA allocator's counters for ``device``; empty off CUDA."""
    return torch.cuda.memory_stats(device) if device.type == "cuda" else {}


@contextmanager
def counting_ooms(
    device: torch.device, memory_stats: MemoryStats = cuda_memory_stats
) -> Iterator[None]:
    """Re-raises a failure as ``torch.OutOfMemoryError`` when the allocator counted an OOM during it.

    Inside a ``.pt2`` package an allocation failure does not surface as an
    OOM: the AOTInductor shim keeps the allocator's message in a
    thread-local and the generated code throws only
    ``aoti_torch_empty_strided(...) API call failed at <file>, line N``. The
    allocator's own counter (``num_ooms``) tells: read before the forward and
    again after a failure, a rise means this batch ran out of memory, so
    the batcher splits it. (The counter is per device: with several workers
    on one GPU a sibling's OOM in the same window counts too, and a split
    of a batch that did not need it is harmless.)
    """
    before = memory_stats(device).get("num_ooms")
    try:
        yield
    except Exception as exc:
        after = memory_stats(device).get("num_ooms") if before is not None else None
        if after is None or after <= before or classify_error(exc) is not ErrorKind.BATCH:
            raise
        raise torch.OutOfMemoryError(
            f"out of memory on {device} (the allocator counted {after - before} OOM(s) "
            f"during this forward): {exc}"
        ) from exc


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
        if "out of memory" in text:
            return ErrorKind.OOM
        if any(marker in text for marker in _STICKY_CUDA_ERRORS):
            return ErrorKind.FATAL
    return ErrorKind.BATCH
