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
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import torch

from predictor.device import streams as device_mod
from predictor.device.slot import DeviceSlot
from predictor.device.streams import StreamLike

Forward = Callable[[list[Any], Any], list[Any]]
StreamFactory = Callable[[torch.device], StreamLike | None]


class DeviceWorkers:
    """The further devices' slots, each worker's own slot, and the calling thread's.

    Args:
        stream_factory: A new stream for one worker on a device, ``None``
            where the device has none; default
            :func:`predictor.device.worker_stream` (a CUDA stream on CUDA,
            none on the CPU). Tests inject a fake where CUDA cannot exist.
    """

    def __init__(self, stream_factory: StreamFactory | None = None) -> None:
        self.slots: dict[str, DeviceSlot] = {}
        self._stream_factory = stream_factory
        self._local = threading.local()

    def current(self) -> DeviceSlot | None:
        """The slot bound to the calling thread; ``None`` for the lone worker (or no worker)."""
        return getattr(self._local, "slot", None)

    def runs(
        self, first: str, first_slot: DeviceSlot, forward: Forward, instances: int
    ) -> Forward | dict[str, Forward]:
        """The batcher's workers: ``instances`` per device, devices in order.

        One device and one instance stays the lone ``forward`` (the batcher
        names it ``0``); otherwise workers are named by device (``cuda:1``),
        with ``#i`` per instance (``cpu#0``, ``cpu#1``), and each is bound to
        a slot of its own (:meth:`worker_slots`).

        Args:
            first: The first device's name (``cpu``, ``cuda:0``).
            first_slot: The first device's package and probed normaliser.
            forward: The family's ``forward_batch``.
            instances: Workers per device.

        Raises:
            ValueError: ``instances`` below 1.
        """
        slots = self.worker_slots(first, first_slot, instances)
        if slots is None:
            return forward
        return {name: self._bound(slot, forward) for name, slot in slots.items()}

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

    def _bound(self, slot: DeviceSlot, forward: Forward) -> Forward:
        """``forward`` with the calling thread bound to ``slot`` (and its stream) for its duration.

        With a stream, the forward runs inside it and the stream is
        synchronised before the outputs are handed back, so they are
        complete whatever the family's ``forward_batch`` waited for.
        """

        def run(samples: list[Any], mode: Any) -> list[Any]:
            self._local.slot = slot
            try:
                if slot.stream is None:
                    return forward(samples, mode)
                with slot.stream.active():
                    outputs = forward(samples, mode)
                    slot.stream.synchronize()
                return outputs
            finally:
                self._local.slot = None

        return run
