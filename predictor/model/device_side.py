"""A model's package side: the package and devices in this process, or a front end's device owner.

Every model has one, chosen when it is built and never asked about again:

* :class:`DeviceSide` (one process, or the device owner of ``--frontends``):
  the package (opened here when start-up did not hand it over), the family's
  checks of it on every device, the normaliser, each worker's slot
  (:class:`~predictor.device.workers.DeviceWorkers`) and, when serving
  starts, the device workers' :class:`~predictor.batching.batcher.DynamicBatcher`,
  which joins the process's :class:`~predictor.batching.scheduler.DeviceScheduler`
  when several models share the devices. Built by the model's ``load``.
* :class:`OwnerSide` (a front end, :class:`FrontEnd`): no package and no
  device; the family's assets read from beside the package (what stage 1
  needs), the device owner's batcher as a proxy, the owner's ``/config``
  answer as what answers and ``/config`` say.

Both give the model's pipeline (:mod:`predictor.model.pipeline`) its batcher
(:meth:`DeviceSide.start`, :meth:`OwnerSide.start`) and say what ``/config``
says of the package (``describe``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from predictor.batching.batcher import Batcher, DynamicBatcher
from predictor.device.failures import classify_error
from predictor.device.normalizer import Normalizer
from predictor.device.slot import DeviceSlot, build_normalizer, build_slot
from predictor.device.workers import DeviceWorkers
from predictor.errors import ModelNotReady
from predictor.model.device_jpeg import JpegDecodePlace
from predictor.model.family import Family
from predictor.model.forward import ForwardBatch, batch_forward, item_tiles, queue_wait_started
from predictor.model.metrics import DeviceSampler, Metrics
from predictor.model.options import ServingOptions
from predictor.model.served_package import ServedPackage
from predictor.packages.facts import inspect_package
from predictor.packages.package_set import config_facts
from predictor.packages.phases import StartupPhases
from predictor.runtime.loader import LoadedPackage, open_package
from predictor.spec import ModelSpec

logger = logging.getLogger("histoserve")


@dataclass(frozen=True)
class FrontEnd:
    """What makes a model a front end (``--frontends``): the device owner's batcher and config.

    A front end decodes and prepares here, submits to the owner's batcher
    through ``batcher`` (:class:`~predictor.multiprocess.proxy.BatcherProxy`)
    and never loads the package: what answers and ``/config`` say of it comes
    from ``owner_config`` (the owner's ``get_metadata``).
    """

    batcher: Batcher
    owner_config: Mapping[str, Any]


class DeviceSide:
    """The package and devices of one model in this process.

    Args:
        name: The model's name (logs, metrics, the scheduler).
        spec: The model's spec.
        options: The model's serving options.
        family: The model's family (its package checks, warm-up and forward).
        served: The served package's facts, which this side binds at load.
        checkpoint: The package's path (opened at load when ``served`` has none).
        device: The first device.
        more_packages: Device name to the package loaded on each further device.
        metrics: Prometheus collectors; ``None``: none.
        phases: The start-up phases the load is timed in.
        forward_batch: A model class's own ``forward_batch`` (the seed's hook
            overridden); ``None``: the family's, on the worker's slot.
        served_by: The model class, for the load's log line.
    """

    def __init__(
        self,
        name: str,
        spec: ModelSpec,
        options: ServingOptions,
        family: Family,
        served: ServedPackage,
        *,
        checkpoint: Path,
        device: torch.device,
        more_packages: Mapping[str, LoadedPackage] | None = None,
        metrics: Metrics | None = None,
        phases: StartupPhases | None = None,
        forward_batch: ForwardBatch | None = None,
        served_by: str = "",
    ) -> None:
        self._name = name
        self._spec = spec
        self._options = options
        self._family = family
        self.served = served
        self._checkpoint = checkpoint
        self._device = device
        self._more_packages = dict(more_packages or {})
        self._metrics = metrics
        self._phases = phases or StartupPhases()
        self._forward_batch = forward_batch
        self._served_by = served_by
        self._normalizer: Normalizer | None = None  # the first device's, built by load
        self.workers = DeviceWorkers(warm_up=family.warm_worker)
        """The further devices' slots, and each worker's (warmed up on CUDA)."""
        self._sampler: DeviceSampler | None = None

    @property
    def device(self) -> torch.device:
        """The first device."""
        return self._device

    def load(self) -> None:
        """Opens the package when not handed one, checks it on every device, warms it up.

        Raises a :class:`~predictor.errors.StartupError` on any problem. The
        package is hashed once: here only when the model was built without one.
        """
        served = self.served
        package = served.package
        if package is None:
            facts = inspect_package(self._checkpoint, self._phases)
            package = open_package(self._checkpoint, self._device, facts, self._phases)
        spec = self._spec
        with self._phases.time("probe"):
            place = JpegDecodePlace(
                self._options.jpeg_decode, package.device, spec.tile_size, spec.interpolation
            )
            served.bind(package, place if place.on_device_enabled else None)
            self._family.check_package(package)
            self._normalizer = build_normalizer(package, spec)
            for dev, more in self._more_packages.items():
                self._family.bind_device(more)
                self.workers.slots[dev] = build_slot(more, spec)
        with self._phases.time("warmup"):
            self._family.warm_up(package)
        logger.info(
            "loaded %s (%s, served by %s) on %s; start-up phases: %s",
            self._checkpoint,
            spec.name,
            self._served_by,
            self._device,
            self._phases.summary(),
        )

    def active_slot(self) -> DeviceSlot:
        """The calling worker's package, normaliser and stream (the first device's off a worker).

        Raises:
            ModelNotReady: Not loaded yet, or stopped.
        """
        slot = self.workers.current()
        if slot is not None:
            return slot
        package = self.served.package
        if package is None or self._normalizer is None:
            raise ModelNotReady(f"model {self._spec.name!r} is not loaded")
        return DeviceSlot(package, self._normalizer)

    def family_forward(
        self, samples: list[Any], requests: list[Any], mode: str = "prediction"
    ) -> list[Any]:
        """The family's ``forward_batch`` on the calling worker's slot, in inference mode."""
        with torch.inference_mode():
            return self._family.forward_batch(samples, requests, mode, self.active_slot())

    async def start(self) -> Batcher:
        """The device workers (``instances_per_device`` per device) and their batcher, started.

        With the process's device scheduler (several models), the batcher
        takes turns on each device with the other models' batchers.
        """
        options = self._options
        forward = batch_forward(self._forward_batch or self.family_forward)
        runs = self.workers.runs(
            str(self._device),
            self.active_slot(),
            forward,
            options.instances_per_device,
            options.batching.max_batch_size,
            cpu_threads=options.cpu_threads_per_instance,
        )
        batcher = DynamicBatcher(
            runs,
            options.batching,
            classify_error=classify_error,
            observer=self._metrics,
            name=self._name,
            weight=item_tiles,
            scheduler=options.scheduler,
            device=str(self._device),
            on_admit=queue_wait_started,
        )
        await batcher.start()
        workers = [w.name for w in batcher.workers]
        logger.info("%s: %d device worker(s): %s", self._name, len(workers), ", ".join(workers))
        metrics = self._metrics
        if metrics is not None:
            metrics.workers_started(workers)
            if self._sampler is None:  # histoserve_device_*, read here from now on
                self._sampler = metrics.watch_devices([str(self._device), *self._more_packages])
            metrics.classes_started(options.batching.priority_levels)
        return batcher

    def describe(self) -> dict[str, Any]:
        """What ``/config`` says of the package: provenance, device, runner, start-up phases."""
        package = self.served.package
        return {
            "jpeg_decode": self.served.jpeg_decode,
            "checkpoint": str(self._checkpoint),
            "device": str(self._device),
            "forward_runner": package.forward_runner if package else "",
            "package_metadata": dict(package.metadata) if package else {},
            "package_sha256": package.sha256 if package else "",
            **config_facts(package),  # build_key, weights_sha256, package_choice
            "startup_seconds": self._phases.as_dict(),
        }

    def stop(self) -> None:
        """Drops the packages (their loaders' files go now) and the device readings."""
        if self._sampler is not None:
            self._sampler.stop()
        self.served.release()
        self._more_packages.clear()
        self.workers.slots.clear()


class OwnerSide:
    """A front end's package side: the device owner, reached through ``front_end.batcher``.

    Args:
        front_end: The owner's batcher (a proxy) and its ``/config`` answer.
        family: The model's family (its assets are read at load).
        served: The owner's package facts.
        assets: The folder the family's assets are read from (the package's).
    """

    def __init__(
        self, front_end: FrontEnd, family: Family, served: ServedPackage, assets: Path
    ) -> None:
        self._front_end = front_end
        self._family = family
        self.served = served
        self._assets = assets

    def load(self) -> None:
        """Reads what stage 1 and the description need from beside the package; nothing loads."""
        self._family.load_assets(self._assets)

    def active_slot(self) -> DeviceSlot:
        """Never: the devices are in the device owner's process.

        Raises:
            ModelNotReady: Always.
        """
        raise ModelNotReady("a front end runs no forward: the devices are the device owner's")

    async def start(self) -> Batcher:
        """The owner's batcher (the proxy), started on the running loop."""
        batcher = self._front_end.batcher
        await batcher.start()
        return batcher

    def describe(self) -> dict[str, Any]:
        """The device owner's ``/config`` answer, whole (it knows the package and the devices)."""
        return dict(self._front_end.owner_config)

    def stop(self) -> None:
        """Nothing to free: the owner holds the package."""
