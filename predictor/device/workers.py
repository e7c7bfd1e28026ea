"""Which device, normaliser and stream a device worker thread serves: one slot per worker.

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

On CUDA each instance is **pipelined** (:mod:`predictor.device.pipeline`):
two workers (``cuda:0#a`` and ``cuda:0#b``; ``cuda:0#0a`` ... with several
instances) share the instance's compute stream and a copy stream, so the
next batch's staging and host-to-device copy overlap the current forward.

Every worker, the lone one too, runs each forward (normalisation, the
package's run, the copy back) with its package's device current and its own
stream (:func:`~predictor.runtime.device_context.on_device`), and inside
:func:`~predictor.device.failures.counting_ooms`, so an allocation failure
inside the package is split like any out-of-memory (the allocator's
counters are read only after a failure). A batch failure on a GPU is
followed by a device sync: a sticky error surfaces there and the batch's
error becomes :class:`~predictor.errors.DeviceLost`
(:func:`~predictor.device.failures.reclassified`). Each worker's staging
buffer is sized once, for the largest batch (:meth:`Normalizer.reserve`),
and, on CUDA, every worker runs one warm-up forward at that batch on its
own stream before the first request (cuBLAS handles, allocator growth).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

from predictor.device import streams as device_mod
from predictor.device.failures import (
    DeviceSync,
    MemoryStats,
    OomCounter,
    classify_error,
    counting_ooms,
    cuda_memory_stats,
    cuda_synchronize,
    reclassified,
)
from predictor.device.pipeline import lanes
from predictor.device.slot import DeviceSlot
from predictor.device.streams import StreamLike
from predictor.errors import ErrorKind, StartupError
from predictor.runtime.device_context import on_device

log = logging.getLogger(__name__)

Forward = Callable[[list[Any], Any], list[Any]]
StreamFactory = Callable[[torch.device], StreamLike | None]
WarmUp = Callable[[DeviceSlot, int], None]
"""Runs one forward of ``batch`` tiles with a worker's slot (the model's warm-up batch)."""


class DeviceWorkers:
    """The further devices' slots, each worker's own slot, and the calling thread's.

    Args:
        stream_factory: A new stream for one worker on a device, ``None``
            where the device has none; default
            :func:`predictor.device.worker_stream` (a CUDA stream on CUDA,
            none on the CPU). Tests inject a fake where CUDA cannot exist.
        memory_stats: A device's allocator counters, read when a worker is
            built and after a failed forward only (:class:`OomCounter`);
            default ``torch.cuda.memory_stats`` on CUDA, none on the CPU.
        pipeline: Two lanes per instance (:mod:`predictor.device.pipeline`);
            ``None``: on CUDA devices only.
        warm_up: One forward at the largest batch with a worker's slot, run
            on each worker's stream before the first request; ``None``: none.
        warm_types: Device types that are warmed up (CUDA; the CPU has
            nothing to warm and tests would pay for it).
        device_sync: Synchronises a whole device after a batch failure
            (:func:`~predictor.device.failures.reclassified`).
    """

    def __init__(
        self,
        stream_factory: StreamFactory | None = None,
        memory_stats: MemoryStats = cuda_memory_stats,
        *,
        pipeline: bool | None = None,
        warm_up: WarmUp | None = None,
        warm_types: tuple[str, ...] = ("cuda",),
        device_sync: DeviceSync = cuda_synchronize,
    ) -> None:
        self.slots: dict[str, DeviceSlot] = {}
        self.pipeline = pipeline
        self._stream_factory = stream_factory
        self._ooms = OomCounter(memory_stats)
        self._warm_up = warm_up
        self._warm_types = warm_types
        self._sync = device_sync
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
        """The batcher's workers: ``instances`` per device (two lanes each when pipelined).

        One device, one instance and no pipeline stays one callable (the
        batcher names it ``0``) that binds nothing; otherwise workers are
        named by device (``cuda:1``), with ``#i`` per instance (``cpu#0``,
        ``cpu#1``) and ``a``/``b`` per lane (``cuda:0#a``, ``cuda:0#1b``),
        and each is bound to a slot of its own (:meth:`worker_slots`).
        Either way each forward runs on its device and stream, OOMs
        counted, sticky errors recognised (:meth:`_bound`), and each worker
        is warmed up at ``max_batch`` first (:meth:`warm`).

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
        for slot in (slots or {first: first_slot}).values():
            slot.normalizer.reserve(max_batch)
            self._ooms.prime(slot.package.device)
        self.warm(slots or {first: first_slot}, max_batch)
        if slots is None:
            return self._bound(first_slot, forward, bind=False)
        return {
            name: self._bound(slot, forward, threads=cpu_threads) for name, slot in slots.items()
        }

    def worker_slots(
        self, first: str, first_slot: DeviceSlot, instances: int
    ) -> dict[str, DeviceSlot] | None:
        """Worker name to its own slot; ``None`` for the lone worker (nothing to bind).

        A device's first instance keeps the normaliser its probe built; each
        further instance (and lane) gets a copy with its own buffer. Every
        worker gets a new stream from the factory (none on the CPU); a
        pipelined instance gets a copy and a compute stream for its lanes.

        Raises:
            ValueError: ``instances`` below 1.
        """
        if instances < 1:
            raise ValueError(f"instances per device must be >= 1, got {instances}")
        devices = {first: first_slot, **self.slots}
        piped = {name: self._pipelined(slot) for name, slot in devices.items()}
        if len(devices) == 1 and instances == 1 and not any(piped.values()):
            return None
        new_stream = self._stream_factory or device_mod.worker_stream
        out: dict[str, DeviceSlot] = {}
        for name, slot in devices.items():
            for i in range(instances):
                normalizer = slot.normalizer if i == 0 else slot.normalizer.for_another_worker()
                own = dataclasses.replace(slot, normalizer=normalizer)
                label = name if instances == 1 else f"{name}#{i}"
                if piped[name]:
                    out.update(_lane_slots(label, own, new_stream, instances == 1))
                else:
                    out[label] = dataclasses.replace(own, stream=new_stream(slot.package.device))
        return out

    def _pipelined(self, slot: DeviceSlot) -> bool:
        device = slot.package.device
        wanted = device.type == "cuda" if self.pipeline is None else self.pipeline
        has_streams = self._stream_factory is not None or device.type == "cuda"
        return wanted and has_streams

    def warm(self, slots: Mapping[str, DeviceSlot], batch: int) -> None:
        """One forward of ``batch`` tiles per worker, each in a thread on the worker's stream.

        The thread returns its cuBLAS handle to torch's pool as it ends and
        the allocator keeps the blocks cached for that stream, so a worker's
        first full batch pays for neither. Each warm-up ends with a device
        sync, so an asynchronous error surfaces here, and a failure is
        classified like a batch's (OOMs counted, then a sync,
        :func:`~predictor.device.failures.reclassified`): an out-of-memory
        is logged (the batcher splits such batches at run time); anything
        else would fail every batch of that worker, so start-up fails.

        Raises:
            StartupError: A worker's warm-up failed other than out of memory
                (the message names the worker, the batch and whether the
                device is lost).
        """
        if self._warm_up is None or batch < 1:
            return
        warm_up = self._warm_up
        for name, slot in slots.items():
            device = slot.package.device
            if device.type not in self._warm_types:
                continue
            failed: list[Exception] = []

            def one(
                slot: DeviceSlot = slot,
                device: torch.device = device,
                failed: list[Exception] = failed,
            ) -> None:
                try:
                    with torch.inference_mode(), counting_ooms(device, self._ooms):
                        _on_slot(slot, lambda *_: warm_up(slot, batch), [], None)
                        self._sync(device)
                except Exception as exc:
                    failed.append(reclassified(device, exc, self._sync))

            thread = threading.Thread(target=one, name=f"warm-up {name}")
            thread.start()
            thread.join()
            if failed:
                _warm_up_failed(name, batch, failed[0])
            self._ooms.mark(device)  # counted from here: a warm-up's OOM is not a batch's

    def _bound(
        self, slot: DeviceSlot, forward: Forward, *, bind: bool = True, threads: int | None = None
    ) -> Forward:
        """``forward`` on ``slot``'s device and stream, OOMs counted; the thread bound to ``slot``.

        With a stream, the stream is synchronised before the outputs are
        handed back, so they are complete whatever the family's
        ``forward_batch`` waited for. ``bind=False`` (the lone worker) leaves
        the thread unbound: the model's own slot is the active one. A
        failure that is neither an OOM nor fatal is checked with a device
        sync (:func:`~predictor.device.failures.reclassified`).
        """
        device = slot.package.device

        def run(samples: list[Any], mode: Any) -> list[Any]:
            if bind:
                self._local.slot = slot
            if threads is not None and device.type == "cpu":
                set_thread_count(self._local, threads)
            try:
                with counting_ooms(device, self._ooms):
                    return _on_slot(slot, forward, samples, mode)
            except Exception as exc:
                error = reclassified(device, exc, self._sync)
                if error is exc:
                    raise
                raise error from exc
            finally:
                self._local.slot = None

        return run


def _warm_up_failed(name: str, batch: int, error: Exception) -> None:
    """Logs a warm-up OOM; raises :class:`StartupError` for any other warm-up failure."""
    kind = classify_error(error)
    if kind is ErrorKind.OOM:
        log.warning("warm-up of worker %s at batch %d ran out of memory: %s", name, batch, error)
        return
    what = "the device is unusable" if kind is ErrorKind.FATAL else "every such batch would fail"
    raise StartupError(
        f"warm-up of worker {name} at batch {batch} failed ({what}): {error}"
    ) from error


def _on_slot(slot: DeviceSlot, forward: Forward, samples: list[Any], mode: Any) -> list[Any]:
    """``forward`` on the slot's device: in its lane, or on its stream then synchronised."""
    device = slot.package.device
    if slot.lane is not None:
        with on_device(device), slot.lane.running():
            return forward(samples, mode)
    with on_device(device, slot.stream):
        outputs = forward(samples, mode)
        if slot.stream is not None:
            slot.stream.synchronize()
    return outputs


def _lane_slots(
    label: str,
    slot: DeviceSlot,
    new_stream: Callable[[torch.device], Any],
    lone: bool,
) -> dict[str, DeviceSlot]:
    """An instance's two lane slots: ``label#a``/``label#b`` (``label`` already has ``#i``: ``label a``)."""
    device = slot.package.device
    pair = lanes(new_stream(device), new_stream(device))
    normalizers = (slot.normalizer, slot.normalizer.for_another_worker())
    out: dict[str, DeviceSlot] = {}
    for suffix, lane, normalizer in zip("ab", pair, normalizers, strict=True):
        normalizer.handoff = lane.handoff
        name = f"{label}#{suffix}" if lone else f"{label}{suffix}"
        out[name] = dataclasses.replace(slot, normalizer=normalizer, stream=lane.stream, lane=lane)
    return out


def set_thread_count(local: threading.local, threads: int) -> None:
    """Sets the calling thread's intra-op thread count once (``torch.set_num_threads``).

    OpenMP keeps the count per calling thread, so each CPU worker's forwards
    run on its own share of the cores whatever the others set.
    """
    if getattr(local, "threads", None) != threads:
        torch.set_num_threads(threads)
        local.threads = threads
