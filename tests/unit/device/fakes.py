"""Fakes for the device layer's tests: streams and events that record, packages that claim a GPU.

No GPU here: :class:`FakeStream` records which stream was current for each
step and every event, wait and sync (:class:`Log`); :class:`FakeGpuPackage`
claims ``cuda:0`` while :class:`Nowhere` makes nothing current, and
:class:`Stats` stands in for the allocator's counters.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from predictor.device.normalizer import Normalizer
from predictor.device.slot import DeviceSlot
from predictor.device.workers import DeviceWorkers
from predictor.spec import BUILTIN_SPECS

SPEC = BUILTIN_SPECS["h0-mini"]


@dataclass
class Log:
    """Every step, in order: (thread's batch label, what, the stream current for it)."""

    steps: list[tuple[str, str, str]] = field(default_factory=list)
    local: threading.local = field(default_factory=threading.local)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str) -> None:
        with self.lock:
            label = getattr(self.local, "label", "?")
            self.steps.append((label, what, getattr(self.local, "stream", "default")))

    def index(self, label: str, what: str) -> int:
        return next(i for i, s in enumerate(self.steps) if s[:2] == (label, what))

    def __contains__(self, step: tuple[str, str]) -> bool:
        with self.lock:
            return any(s[:2] == step for s in self.steps)


def waits_in(thread: threading.Thread, function: Any) -> bool:
    """Whether ``thread`` is inside ``function`` now (blocked there, for a lock)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code is function.__code__:
            return True
        frame = frame.f_back
    return False


class FakeStream:
    """A CUDA stream's stand-in: records ``active``, events, waits, syncs and kept tensors."""

    count = 0

    def __init__(self, log: Log) -> None:
        FakeStream.count += 1
        self.name = f"s{FakeStream.count}"
        self.log = log

    @contextmanager
    def active(self) -> Iterator[None]:
        before = getattr(self.log.local, "stream", "default")
        self.log.local.stream = self.name
        try:
            yield
        finally:
            self.log.local.stream = before

    def synchronize(self) -> None:
        self.log.add(f"sync {self.name}")

    def record(self) -> str:
        self.log.add(f"record {self.name}")
        return f"event of {self.name}"

    def wait(self, event: str) -> None:
        self.log.add(f"{self.name} waits for {event}")

    def wait_host(self, event: str) -> None:
        self.log.add(f"host waits for {event}")

    def keep(self, tensor: torch.Tensor) -> None:
        self.log.add(f"keep on {self.name}")


class FakePackage:
    """Stands in for a loaded package on ``device``; the forward is the test's."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.input_dtype = torch.float32

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (inputs[0].flatten(1)[:, :4].clone(),)


def tiles(n: int) -> list[np.ndarray]:
    return [np.full((224, 224, 3), i, dtype=np.uint8) for i in range(n)]


def pipelined(log: Log, **kw: Any) -> tuple[DeviceWorkers, DeviceSlot]:
    workers = DeviceWorkers(stream_factory=lambda d: FakeStream(log), pipeline=True, **kw)
    slot = DeviceSlot(FakePackage(), Normalizer(SPEC, torch.device("cpu"), torch.float32))
    return workers, slot


SHIM = "aoti_torch_cuda_mm_out(buf3, buf1, buf2) API call failed at model.wrapper.cpp, line 88"
STICKY = "CUDA error: an illegal memory access was encountered"


class Nowhere:
    """A device context that makes nothing current (no CUDA in this process)."""

    def enter(self, device: torch.device, stream: Any) -> AbstractContextManager[None]:
        @contextmanager
        def nothing() -> Iterator[None]:
            yield

        return nothing()


class FakeGpuPackage:
    device = torch.device("cuda", 0)
    input_dtype = torch.float32


class Stats:
    """``torch.cuda.memory_stats``'s stand-in: counts its reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.num_ooms = 0

    def __call__(self, device: torch.device) -> dict[str, int]:
        self.reads += 1
        return {"num_ooms": self.num_ooms}
