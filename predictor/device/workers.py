"""Which device, normaliser and stream a batcher worker thread serves: one slot per worker.

Under ``--device auto`` with several GPUs every GPU gets its own loaded
package (one :class:`~predictor.device.DeviceSlot` per further GPU, probed at
start-up) and ``instances_per_device`` workers on the batcher's one queue.
With more than one worker in all, every worker gets a slot of its own: its
device's package, its own :class:`~predictor.device.Normalizer` (so its own
staging buffer) and, on CUDA, its own stream
(:class:`~predictor.device.WorkerStream`). A worker's thread binds its slot
around each forward and runs it inside its stream, so the family's
``forward_batch`` (which asks the model for the active slot) runs on that
worker's device and stream without knowing how many workers there are, and
one worker's copy and forward overlap another's compute on the same GPU.
The lone worker (one device, one instance) binds nothing: it uses the
model's own package and normaliser on the default stream, as always.

Every worker, the lone one too, runs each forward (normalisation, the
package's run, the copy back) with its package's device current and its own
stream (:func:`~predictor.package.device_context.on_device`), and inside
:func:`~predictor.device.failures.counting_ooms`, so an allocation failure
inside the package is split like any out-of-memory. Each worker's staging
buffer is sized once, for the largest batch (:meth:`Normalizer.reserve`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import torch

from predictor.device import streams as device_mod
from predictor.device.failures import MemoryStats, counting_ooms, cuda_memory_stats
from predictor.device.slot import DeviceSlot
from predictor.device.streams import StreamLike
from predictor.package.device_context import on_device

Forward = Callable[[list[Any], Any], list[Any]]
StreamFactory = Callable[[torch.device], StreamLike | None]


class DeviceWorkers:
    """The further devices' slots, each worker's own slot, and the calling thread's.

    Args:
        stream_factory: A new stream for one worker on a device, ``None``
            where the device has none; default
            :func:`predictor.device.worker_stream` (a CUDA stream on CUDA,
            none on the CPU). Tests inject a fake where CUDA cannot exist.
        memory_stats: A device's allocator counters, read around each
            forward (:func:`~predictor.device.failures.counting_ooms`);
            default ``torch.cuda.memory_stats`` on CUDA, none on the CPU.
    """

    def __init__(
        self,
        stream_factory: StreamFactory | None = None,
        memory_stats: MemoryStats = cuda_memory_stats,
    ) -> None:
        self.slots: dict[str, DeviceSlot] = {}
        self._stream_factory = stream_factory
        self._memory_stats = memory_stats
        self._local = threading.local()

    def current(self) -> DeviceSlot | None:
        """The slot bound to the calling thread; ``None`` for the lone worker (or no worker)."""
        return getattr(self._local, "slot", None)

    def runs(
        self,
        first: str,
        first_slot: DeviceSlot,
        forward: Forward,
        instances: int,
        max_batch: int = 0,
        *,
        cpu_threads: int | None = None,
    ) -> Forward | dict[str, Forward]:
        """The batcher's workers: ``instances`` per device, devices in order.

        One device and one instance stays one callable (the batcher names it
        ``0``) that binds nothing; otherwise workers are named by device
        (``cuda:1``), with ``#i`` per instance (``cpu#0``, ``cpu#1``), and
        each is bound to a slot of its own (:meth:`worker_slots`). Either way
        each forward runs on its device and stream, OOMs counted
        (:meth:`_bound`).

        Args:
            first: The first device's name (``cpu``, ``cuda:0``).
            first_slot: The first device's package and probed normaliser.
            forward: The family's ``forward_batch``.
            instances: Workers per device.
            max_batch: The largest batch (``max_batch_size``): every worker's
                staging buffer is sized for it once; 0 lets it grow.
            cpu_threads: Intra-op threads each CPU worker's thread sets for
                itself before its first forward (OpenMP's count is per
                thread); None leaves torch's count.

        Raises:
            ValueError: ``instances`` below 1.
        """
        slots = self.worker_slots(first, first_slot, instances)
        if slots is None:
            first_slot.normalizer.reserve(max_batch)
            return self._bound(first_slot, forward, bind=False)
        for slot in slots.values():
            slot.normalizer.reserve(max_batch)
        return {
            name: self._bound(slot, forward, threads=cpu_threads) for name, slot in slots.items()
        }

    def worker_slots(
        self, first: str, first_slot: DeviceSlot, instances: int
    ) -> dict[str, DeviceSlot] | None:
        """Worker name to its own slot; ``None`` for the lone worker (nothing to bind).

        A device's first instance keeps the normaliser its probe built; each
        further instance gets a copy with its own buffer. Every worker gets a
        new stream from the factory (none on the CPU).

        Raises:
            ValueError: ``instances`` below 1.
        """
        if instances < 1:
            raise ValueError(f"instances per device must be >= 1, got {instances}")
        devices = {first: first_slot, **self.slots}
        if len(devices) == 1 and instances == 1:
            return None
        new_stream = self._stream_factory or device_mod.worker_stream
        out: dict[str, DeviceSlot] = {}
        for name, slot in devices.items():
            for i in range(instances):
                normalizer = slot.normalizer if i == 0 else slot.normalizer.for_another_worker()
                stream = new_stream(slot.package.device)
                own = dataclasses.replace(slot, normalizer=normalizer, stream=stream)
                out[name if instances == 1 else f"{name}#{i}"] = own
        return out

    def _bound(
        self, slot: DeviceSlot, forward: Forward, *, bind: bool = True, threads: int | None = None
    ) -> Forward:
        """``forward`` on ``slot``'s device and stream, OOMs counted; the thread bound to ``slot``.

        With a stream, the stream is synchronised before the outputs are
        handed back, so they are complete whatever the family's
        ``forward_batch`` waited for. ``bind=False`` (the lone worker) leaves
        the thread unbound: the model's own slot is the active one.
        """
        device = slot.package.device

        def run(samples: list[Any], mode: Any) -> list[Any]:
            if bind:
                self._local.slot = slot
            if threads is not None and device.type == "cpu":
                set_thread_count(self._local, threads)
            try:
                with counting_ooms(device, self._memory_stats), on_device(device, slot.stream):
                    outputs = forward(samples, mode)
                    if slot.stream is not None:
                        slot.stream.synchronize()
                return outputs
            finally:
                self._local.slot = None

        return run


def set_thread_count(local: threading.local, threads: int) -> None:
    """Sets the calling thread's intra-op thread count once (``torch.set_num_threads``).

    OpenMP keeps the count per calling thread, so each CPU worker's forwards
    run on its own share of the cores whatever the others set.
    """
    if getattr(local, "threads", None) != threads:
        torch.set_num_threads(threads)
        local.threads = threads
