"""What one device worker runs with (:class:`DeviceSlot`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from predictor.device.normalizer import Normalizer
from predictor.device.streams import StreamLike


@dataclass(frozen=True)
class DeviceSlot:
    """What one device worker runs with: a device's package, its own normaliser and stream.

    With several workers (several GPUs under ``--device auto``, or
    ``--instances_per_device`` above 1) each worker gets a slot, bound by its
    thread around each forward (:mod:`predictor.device.workers`). Workers of
    one device share the package (its container holds one model copy per
    instance and hands each concurrent run its own); nothing else mutable is
    shared. ``stream`` is ``None`` off CUDA and for the lone worker (which
    runs on the default stream).
    """

    package: Any  # a predictor.package.loader.LoadedPackage
    normalizer: Normalizer
    stream: StreamLike | None = None
