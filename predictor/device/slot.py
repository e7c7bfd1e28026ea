"""What one device worker runs with (:class:`DeviceSlot`), and how one is built for a package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from predictor.device.normalizer import Normalizer, synchronize
from predictor.device.pipeline import Lane
from predictor.device.streams import StreamLike
from predictor.spec import ModelSpec


class DevicePackage(Protocol):
    """What the device layer needs of a loaded package (:class:`predictor.runtime.loader.LoadedPackage`)."""

    @property
    def device(self) -> torch.device:
        """The device the package runs on."""

    @property
    def input_dtype(self) -> torch.dtype:
        """Dtype of its first (tile) input."""

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Runs the package on one batch; a flat tuple of outputs, primary first."""


@dataclass(frozen=True)
class DeviceSlot:
    """What one device worker runs with: a device's package, its own normaliser and stream.

    With several workers (several GPUs under ``--device auto``, or
    ``--instances_per_device`` above 1) each worker gets a slot, bound by its
    thread around each forward (:mod:`predictor.device.workers`). Workers of
    one device share the package (its container holds one model copy per
    instance and hands each concurrent run its own); nothing else mutable is
    shared. ``stream`` is ``None`` off CUDA and for the lone worker (which
    runs on the default stream). ``lane`` is set for a pipelined CUDA
    worker (:mod:`predictor.device.pipeline`): its ``stream`` is then the
    instance's compute stream, shared with the other lane.
    """

    package: DevicePackage
    normalizer: Normalizer
    stream: StreamLike | None = None
    lane: Lane | None = None

    def staged(self, batch: torch.Tensor) -> None:
        """A batch the family moved to the device itself (not through the normaliser) is there.

        A lane takes the turn for it (:meth:`~predictor.device.pipeline.Lane.handoff`),
        so its forward runs on the compute stream like a tile batch's;
        elsewhere nothing happens.
        """
        if self.lane is not None:
            self.lane.handoff(batch)

    def settle(self) -> None:
        """The batch's device work, its copies to the host included, is queued: wait for it.

        A lane gives the turn back first and then waits on an event
        (:meth:`~predictor.device.pipeline.Lane.release`), so the answers
        are built while the other lane's forward runs; elsewhere the
        calling thread's stream is synchronised. After it the outputs
        copied to the host (:func:`~predictor.device.normalizer.to_host`)
        are complete.
        """
        if self.lane is None or not self.lane.release():
            synchronize(self.package.device)


def build_normalizer(package: DevicePackage, spec: ModelSpec) -> Normalizer:
    """A new normaliser for ``package``'s device and input dtype, with ``spec``'s mean and std."""
    return Normalizer(spec, package.device, package.input_dtype)


def build_slot(package: DevicePackage, spec: ModelSpec) -> DeviceSlot:
    """A device's slot: ``package`` and a new normaliser for it (:func:`build_normalizer`).

    The slot has no stream: :class:`~predictor.device.workers.DeviceWorkers`
    gives each worker its own.
    """
    return DeviceSlot(package, build_normalizer(package, spec))
