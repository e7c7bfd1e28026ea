"""Which device a batcher worker thread serves: one slot per further GPU.

Under ``--device auto`` with several GPUs every GPU gets its own loaded
package and normaliser (a :class:`~predictor.device.DeviceSlot`) and
``instances_per_device`` workers on the batcher's one queue. A worker's
thread binds its device's slot around each forward, so the family's
``forward_batch`` (which asks the model for the active slot) runs on that
worker's device without knowing how many devices there are. The first
device needs no slot: a thread with none bound uses the model's own package.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from predictor.device import DeviceSlot

Forward = Callable[[list[Any], Any], list[Any]]


class DeviceWorkers:
    """The further devices' slots, and the slot the calling worker thread serves."""

    def __init__(self) -> None:
        self.slots: dict[str, DeviceSlot] = {}
        self._local = threading.local()

    def current(self) -> DeviceSlot | None:
        """The slot bound to the calling thread; ``None`` on the first device."""
        return getattr(self._local, "slot", None)

    def runs(self, first: str, forward: Forward, instances: int) -> Forward | dict[str, Forward]:
        """The batcher's workers: ``instances`` per device, devices in order.

        One device and one instance stays the lone ``forward`` (the batcher
        names it ``0``); otherwise workers are named by device (``cuda:1``),
        with ``#i`` per instance (``cpu#0``, ``cpu#1``).

        Raises:
            ValueError: ``instances`` below 1.
        """
        if instances < 1:
            raise ValueError(f"instances per device must be >= 1, got {instances}")
        devices: dict[str, DeviceSlot | None] = {first: None, **self.slots}
        if len(devices) == 1 and instances == 1:
            return forward
        runs: dict[str, Forward] = {}
        for name, slot in devices.items():
            run = forward if slot is None else self._bound(slot, forward)
            for i in range(instances):
                runs[name if instances == 1 else f"{name}#{i}"] = run
        return runs

    def _bound(self, slot: DeviceSlot, forward: Forward) -> Forward:
        """``forward`` with the calling thread bound to ``slot`` for its duration."""

        def run(samples: list[Any], mode: Any) -> list[Any]:
            self._local.slot = slot
            try:
                return forward(samples, mode)
            finally:
                self._local.slot = None

        return run
