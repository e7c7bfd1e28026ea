"""``BaseServerModel``: the seed's server model, one class for every family.

The model is composed of parts it is given or builds, never of mixins: its
family (:class:`~predictor.model.family.Family`, the hooks that differ per
family; :class:`~predictor.model.tiles.TileFamily` for embedding backbones),
the served package (:class:`~predictor.model.served_package.ServedPackage`),
the devices (:class:`~predictor.device.workers.DeviceWorkers`, one slot per
worker), the decode pool, admission, the batcher
(:class:`~predictor.batching.batcher.Batcher`) and KServe's ``Model``, the
one class it inherits. A front end (``--frontends``) is a model built with a
:class:`FrontEnd`: said at construction, it decodes here and never loads the
package.

The seed's extension API is this class's: a model author subclasses it and
overrides ``prepare_sample`` and ``forward_batch(samples, requests, mode)``
(the seed's signatures), calling ``super()`` where the family's defaults
serve; ``python -m predictor --model_class MODULE:CLASS`` serves such a
subclass. Stage 1 calls the model's ``prepare_sample`` and the device worker
its ``forward_batch``, which hand over to the family.

KServe calls :meth:`~BaseServerModel.preprocess` (stage 1), :meth:`predict`
(stage 2) and :meth:`postprocess` on one request. Stage 1 picks the request's
codec once (V1 for a dict body, V2 for an ``InferRequest``), decodes it into
per-tile :class:`~predictor.codecs.samples.ModelRequest` items and runs
``prepare_sample`` on each in a thread pool (an error there is a 400 for that
request only). Stage 2 hands the prepared samples with their requests, and
nothing else, to the batcher, which calls ``forward_batch`` on one device
worker (an error there is a 503 for that batch only). The same codec encodes
the responses. See ``docs/architecture.md`` for the whole walk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from predictor import tracing
from predictor.batching.batcher import Batcher, DynamicBatcher
from predictor.codecs.base import Codec
from predictor.codecs.jpeg_input import decode_pixels
from predictor.codecs.samples import DecodedRequest, ModelRequest, ModelResponse, PreparedSample
from predictor.codecs.v1 import V1Codec
from predictor.config import BatchingConfig
from predictor.device.failures import classify_error
from predictor.device.faults import FaultHook
from predictor.device.normalizer import Normalizer
from predictor.device.slot import DeviceSlot, build_normalizer, build_slot
from predictor.device.workers import DeviceWorkers
from predictor.errors import InvalidInput, ModelNotReady, Overloaded, SpecError
from predictor.kserve.compat import InferenceVerb, InferRequest, InferResponse, Model
from predictor.kserve.stage_call import StageCall
from predictor.model.admission import Admission
from predictor.model.device_jpeg import JpegDecodePlace
from predictor.model.family import Family, request_mode
from predictor.model.forward import BatchItem, batch_forward, item_tiles, request_tiles
from predictor.model.metrics import DeviceSampler, Metrics
from predictor.model.options import ServingOptions
from predictor.model.served_package import ServedPackage
from predictor.model.stage1 import Stage1Pool
from predictor.model.tiles import TileFamily, transform_bulk_rna
from predictor.pt2.loader import LoadedPackage, StartupPhases, inspect_package, open_package
from predictor.pt2.package_set import config_facts
from predictor.spec import ModelSpec

logger = logging.getLogger("histoserve")

MODEL_ROOT = Path("/opt/ml/model")


@dataclass
class _Prepared:
    """One request between the stages: its codec, decoded form, mode, samples and class.

    ``deadline`` (``time.monotonic()``) is its ``timeout`` from its arrival, or None.
    """

    codec: Codec
    decoded: DecodedRequest
    mode: str
    samples: list[PreparedSample]
    priority: int
    deadline: float | None


@dataclass(frozen=True)
class FrontEnd:
    """What makes a model a front end (``--frontends``): the device owner's batcher and config.

    A front end decodes and prepares here, submits to the owner's batcher
    through ``batcher`` (:class:`~predictor.multiprocess.proxy.BatcherProxy`)
    and never loads the package: what answers say of it comes from
    ``owner_config`` (the owner's ``get_metadata``).
    """

    batcher: Batcher
    owner_config: Mapping[str, Any]


class BaseServerModel(Model):
    """Loads an exported ``.pt2`` package and serves it over KServe with dynamic batching.

    Used directly for every built-in family: the spec's family is a part
    (``family``). Override ``prepare_sample`` and ``forward_batch`` for
    models that need custom input handling.

    Args:
        model_spec: The model specification (tile size, normalisation, ...).
        checkpoint_name: File name of the ``.pt2`` inside ``model_root``.
        device: Torch device string (``cpu``, ``cuda``, ``cuda:N``).
        model_root: Directory containing the checkpoints.
        options: Batching, limits and naming; see :class:`ServingOptions`.
        metrics: Prometheus collectors; ``None`` disables metrics.
        fault_hook: Test-only forward fault injection; ``None`` in production.
        package: The package already verified and loaded by
            :func:`predictor.startup.build_model`; when ``None``, :meth:`load`
            verifies and loads it itself (once, either way).
        more_packages: Device name to the same package loaded on each further
            device (one per GPU after the first under ``--device auto``); each
            gets its own worker(s), normaliser and probe.
        family: The family class whose hooks serve the spec
            (:func:`predictor.families.family_for`); ``None``: the embedding
            backbone's (:class:`~predictor.model.tiles.TileFamily`), which
            only an ``embedding`` spec may use.
        front_end: Set in a front end (:mod:`predictor.multiprocess`): stage 1
            runs here, the package is never loaded in this process (``load``
            reads only the family's assets).

    Raises:
        SpecError: No family given for a spec of another family than ``embedding``.
    """

    def __init__(
        self,
        model_spec: ModelSpec,
        checkpoint_name: str,
        device: str = "cuda",
        model_root: Path = MODEL_ROOT,
        *,
        options: ServingOptions | None = None,
        metrics: Metrics | None = None,
        fault_hook: FaultHook | None = None,
        package: LoadedPackage | None = None,
        more_packages: Mapping[str, LoadedPackage] | None = None,
        family: type[Family] | None = None,
        front_end: FrontEnd | None = None,
    ):
        if family is None and model_spec.family != "embedding":
            raise SpecError(
                f"spec {model_spec.name!r} is of the {model_spec.family!r} family: build its "
                "model with family=predictor.families.family_for(spec)"
            )
        family = family or TileFamily
        options = family.serving_options(options or ServingOptions(), package)
        Model.__init__(self, options.name or model_spec.name)
        self._spec = model_spec
        self._options = options
        self.served = ServedPackage(package)
        self.family = family(
            model_spec,
            options,
            self.served,
            fault_hook,
            bulk_rna_transform=self.preprocess_bulk_rna,
        )
        self._normalizer: Normalizer | None = None  # the first device's, built by load
        # the further devices' slots, and each worker's (warmed up on CUDA)
        self._devices = DeviceWorkers(warm_up=self.family.warm_worker)
        self._checkpoint = Path(model_root) / checkpoint_name
        self._device = torch.device(device)
        self._metrics = metrics
        self._device_sampler: DeviceSampler | None = None
        self._more_packages = dict(more_packages or {})
        self._phases = package.phases if package is not None else StartupPhases()
        self._pool: Stage1Pool | None = None
        self._front_end = front_end is not None
        self._batcher: Batcher | None = front_end.batcher if front_end is not None else None
        if front_end is not None:
            self.served.served_from(front_end.owner_config)
        self._stopped = False
        self._stage_call = StageCall(self.name)
        self._v1 = V1Codec(model_spec, options.limits)
        self._v2 = self.family.v2_codec(self.name)
        self._output_names: dict[str, tuple[str, ...]] = {}  # per mode, the names never change
        batching = options.batching
        self._admission = Admission(
            self.name,
            batching.max_queue_size,
            batching.retry_after_s,
            batching.max_decode_pixels,
            on_reject=lambda n: self._count("rejected", n),
        )

    # -- identity -------------------------------------------------------------------------
    @property
    def model_spec(self) -> ModelSpec:
        """The model's specification (tile size, normalisation, etc.)."""
        return self._spec

    @property
    def model_name(self) -> str:
        """Human-readable model identifier (the name in URLs)."""
        return self.name

    @property
    def device(self) -> torch.device:
        """The device the package runs on."""
        return self._device

    @property
    def batching(self) -> BatchingConfig:
        """The batching this model serves with: the flags as its family resolved them
        (a slide head's one slide a batch), the one value every part reads."""
        return self._options.batching

    # -- lifecycle ------------------------------------------------------------------------
    def load(self) -> bool:
        """Checks the package against the spec (loading it first if not handed one).

        Raises a :class:`~predictor.errors.StartupError` on any problem. The
        package is hashed once: here only when the constructor got none.
        Idempotent: KServe calls ``load`` again whenever the model reports not
        ready (e.g. while draining), which must not reload anything.
        """
        if self._stopped:
            return False
        if self._pool is None and self._front_end:  # never loads the package
            self.family.load_assets(self._checkpoint.parent)
            self._pool = Stage1Pool(self._options.preprocess_workers, self._spec.tile_size)
        if self._pool is None:
            served = self.served
            if served.package is None:
                facts = inspect_package(self._checkpoint, self._phases)
                served.package = open_package(self._checkpoint, self._device, facts, self._phases)
            package = served.package
            with self._phases.time("probe"):
                self.family.check_package(package)
                self._normalizer = build_normalizer(package, self._spec)
                place = JpegDecodePlace(
                    self._options.jpeg_decode,
                    package.device,
                    self._spec.tile_size,
                    self._spec.interpolation,
                )
                served.jpeg = place if place.on_device_enabled else None
                for dev, more in self._more_packages.items():
                    self.family.bind_device(more)
                    self._devices.slots[dev] = build_slot(more, self._spec)
            with self._phases.time("warmup"):
                self.family.warm_up(package)
            self._pool = Stage1Pool(self._options.preprocess_workers, self._spec.tile_size)
            logger.info(
                "loaded %s (%s, served by %s.%s) on %s; start-up phases: %s",
                self._checkpoint,
                self._spec.name,
                type(self).__module__,
                type(self).__qualname__,
                self._device,
                self._phases.summary(),
            )
        self.ready = not self._admission.draining
        return self.ready

    async def start_batching(self) -> None:
        """Starts the batcher inside the running event loop (called by the server)."""
        if self._front_end:  # the proxy's: the device owner holds the workers
            assert self._batcher is not None
            await self._batcher.start()
            return
        if self._batcher is None:
            first = self.active_slot()
            instances = self._options.instances_per_device
            max_batch = self._options.batching.max_batch_size
            forward = batch_forward(self.forward_batch)
            threads = self._options.cpu_threads_per_instance
            runs = self._devices.runs(
                str(self._device), first, forward, instances, max_batch, cpu_threads=threads
            )
            self._batcher = DynamicBatcher(
                runs,
                self._options.batching,
                classify_error=classify_error,
                observer=self._metrics,
                name=self.name,
                weight=item_tiles,
                scheduler=self._options.scheduler,
                device=str(self._device),
            )
        await self._batcher.start()
        workers = [w.name for w in self._batcher.workers]
        logger.info("%s: %d device worker(s): %s", self.name, len(workers), ", ".join(workers))
        if self._metrics is not None:
            self._metrics.workers_started(workers)
            if self._device_sampler is None:  # histoserve_device_*, read here from now on
                devices = [str(self._device), *self._more_packages]
                self._device_sampler = self._metrics.watch_devices(devices)
            self._metrics.classes_started(self._options.batching.priority_levels)

    async def drain(self, timeout_s: float, why: str = "shutdown") -> bool:
        """Turns readiness false, refuses new work and waits for admitted work.

        Admitted requests still in stage 1 (decoding) have not reached the
        batcher yet, so the batcher keeps accepting their tiles until every
        admitted request has finished or the deadline passes; then the
        batcher drains whatever is left in the time that remains.
        """
        admission = self._admission
        admission.start_draining(why)
        self.ready = False
        deadline = time.monotonic() + timeout_s
        if not await admission.wait_idle(timeout_s):
            logger.warning(
                "%s: %d admitted requests still running at the drain deadline",
                self.name,
                admission.admitted,
            )
        if self._batcher is None:
            return admission.admitted == 0
        drained = await self._batcher.drain(max(0.0, deadline - time.monotonic()))
        return drained and admission.admitted == 0

    async def healthy(self) -> bool:
        """Ready for traffic: loaded, not draining, device usable."""
        return bool(self.ready and not self._admission.draining and self.live)

    @property
    def live(self) -> bool:
        """False once a sticky device error made the device unusable."""
        return self._batcher is None or self._batcher.healthy

    @property
    def batcher(self) -> Batcher | None:
        """The running batcher (None before :meth:`start_batching`): the device owner's seam."""
        return self._batcher

    def stop(self) -> None:
        """Closes the batcher and releases the stage-1 pool and the package for good.

        Call on the serving loop's thread (the server's shutdown does), or
        after it ended. Whatever is still queued fails with ``ModelNotReady``
        and the device worker threads end (drain first for a graceful stop).
        Dropping the package runs its loader's destructor now, which deletes the
        files it extracted, so the process can exit without a full garbage
        collection (see ``predictor.__main__``).
        """
        self.ready = False
        self._stopped = True
        if self._device_sampler is not None:
            self._device_sampler.stop()
        if self._batcher is not None:
            self._batcher.close_nowait()
        if self._pool is not None:
            self._pool.shutdown()
        self.served.package = None
        self._more_packages.clear()
        self._devices.slots.clear()

    # -- kserve entry points --------------------------------------------------------------
    async def __call__(self, body: Any, headers: dict[str, str] | None = None, verb: Any = None):
        with self._admission.request():
            if self._metrics is None:
                return await self._call(body, headers, verb)
            with self._metrics.inflight():
                return await self._call(body, headers, verb)

    async def _call(self, body: Any, headers: dict[str, str] | None, verb: Any):
        """KServe's ``Model.__call__``, for a predict without its per-request lookups.

        A predict goes through :class:`~predictor.kserve.stage_call.StageCall` (the
        same stage histograms, return shape and trace line); explain, and a
        model asked for response headers, go through KServe's own, so they
        answer as they always did.
        """
        if (verb is not None and verb != InferenceVerb.PREDICT) or self.required_response_headers:
            return await super().__call__(body, headers, verb or InferenceVerb.PREDICT)
        return await self._stage_call(self, body, headers)

    def validate(self, payload: Any) -> Any:
        """Codecs validate; KServe's dict checks would misread our payload."""
        return payload

    async def preprocess(
        self, payload: dict | InferRequest, headers: dict[str, str] | None = None
    ) -> _Prepared:
        """Stage 1: pick the codec, decode, prepare every tile; 400 on any bad input."""
        if self._admission.draining or self._pool is None:
            raise ModelNotReady(
                f"model {self.name!r} is not accepting requests (draining or not loaded)"
            )
        started = time.monotonic()
        with tracing.stage(tracing.current_request(), "decode"):
            codec: Codec = self._v2 if isinstance(payload, InferRequest) else self._v1
            decoded = codec.decode(payload)
            timeout_us = decoded.timeout_us
            deadline = started + timeout_us / 1e6 if timeout_us else None
            try:
                priority = self._options.batching.priority_of(decoded.priority)
                mode = request_mode(self.family, decoded.mode, decoded.requested_outputs)
                codec.check_outputs(decoded, self.output_names(mode))  # before any compute
                samples = await self._prepare_staged(decoded, priority)
            except InvalidInput:
                self._count("invalid", request_tiles(decoded.items))
                raise
        if self._metrics is not None:
            self._metrics.observe_preprocess(time.monotonic() - started)
        return _Prepared(codec, decoded, mode, samples, priority, deadline)

    async def predict(
        self, payload: _Prepared, headers: dict[str, str] | None = None
    ) -> tuple[_Prepared, list[ModelResponse]]:
        """Stage 2: enqueue the samples (with their requests) and await one response per tile, in order."""
        if self._batcher is None:
            raise ModelNotReady(f"model {self.name!r} has no running batcher")
        trace = tracing.current_request()
        if trace is None:
            items = list(map(BatchItem, payload.samples, payload.decoded.items))
        else:  # the trace rides on each item; a front end's owner times its own queue
            items = [
                BatchItem(s, r, trace)
                for s, r in zip(payload.samples, payload.decoded.items, strict=True)
            ]
            if not self._front_end:
                trace.queue_wait_started()
        futures = self._batcher.submit(
            items, key=payload.mode, priority=payload.priority, deadline=payload.deadline
        )
        try:
            results = await asyncio.gather(*futures)
        except Overloaded:  # refused by the device owner's batcher: counted there, once
            raise
        except Exception:
            self._count("failed", request_tiles(payload.decoded.items))
            raise
        self._count("ok", request_tiles(payload.decoded.items))
        return payload, list(results)

    async def postprocess(
        self, result: tuple[_Prepared, list[ModelResponse]], headers: dict[str, str] | None = None
    ) -> dict | InferResponse:
        """Encodes the responses with the codec the request was decoded with."""
        prepared, responses = result
        trace = tracing.current_request()
        if trace is not None:
            trace.answer_started()  # ended by the front door once it is sent
        names = self.output_names(prepared.mode)
        parameters = self.served.answer_parameters(prepared.samples)
        return prepared.codec.encode(prepared.decoded, responses, names, parameters)

    async def _prepare_staged(self, decoded: DecodedRequest, priority: int) -> list[PreparedSample]:
        """Stage 1 for every tile, refused up front (fast 503) when its class's queue is full
        or stage 1 holds as many pixels to decode as it may."""
        depth = self._batcher.depth_of(priority) if self._batcher is not None else 0
        cost = decode_pixels(item.jpeg for item in decoded.items)
        with self._admission.staged(request_tiles(decoded.items), depth, cost, priority):
            return await self._pool.prepare(
                decoded.items, decoded.tile_input, self.prepare_sample, cost
            )

    # -- the seed's hooks: the family's, overridable ---------------------------------------
    def prepare_sample(self, request: ModelRequest) -> PreparedSample:
        """Deserialises, transforms and validates one tile; a ``ValueError`` is a 400.

        Called in the stage-1 thread pool; the family's
        (:meth:`~predictor.model.family.Family.prepare_sample`). A tile family
        hands the tile over as ``uint8 [H, W, 3]``; a subclass may return the
        seed's ``(3, H, W)`` instead. Normalisation happens on the device.
        """
        return self.family.prepare_sample(request)

    @torch.inference_mode()
    def forward_batch(
        self,
        samples: list[PreparedSample],
        requests: list[ModelRequest],
        mode: str = "prediction",
    ) -> list[ModelResponse]:
        """Runs one batch on the calling worker's device: one response per sample, aligned.

        The family's (:meth:`~predictor.model.family.Family.forward_batch`),
        on the worker's slot (:meth:`active_slot`). Any failure propagates as
        raised: the batcher classifies it and fails the batch (503); a
        response that is an exception fails its own request only.

        Args:
            samples: Samples that passed :meth:`prepare_sample`.
            requests: Each sample's request (for response metadata), aligned.
            mode: The request's mode (``prediction``, ``embedding``, ...).
        """
        return self.family.forward_batch(samples, requests, mode, self.active_slot())

    @torch.inference_mode()
    def forward(self, requests: list[ModelRequest]) -> torch.Tensor:
        """Runs the model on a batch of tile requests (the seed's legacy path).

        Prepares each request, runs one forward and returns the primary
        output on the host, ``[N, ...]`` (``[N, D]`` for an embedding).

        Raises:
            InvalidInput: A request :meth:`prepare_sample` refuses.
            SpecError: The family is not a tile family.
        """
        if not isinstance(self.family, TileFamily):
            raise SpecError(f"model {self.name!r}: the legacy forward serves tile families only")
        samples = [self.prepare_sample(r) for r in requests]
        return self.family.forward_primary(samples, self.active_slot())

    def preprocess_bulk_rna(self, raw: Sequence[float] | np.ndarray) -> np.ndarray:
        """Applies the spec's omics transform to raw counts (``float32``; unchanged when none).

        The seed's hook: a subclass overriding it is what stage 1 applies to
        every request's counts (its ``ValueError`` is that request's 400).
        """
        return transform_bulk_rna(self._spec, raw)

    def active_slot(self) -> DeviceSlot:
        """The calling worker's package, normaliser and stream (the model's own off a worker).

        Raises:
            ModelNotReady: Not loaded yet, or stopped.
        """
        slot = self._devices.current()
        if slot is not None:
            return slot
        package = self.served.package
        if package is None or self._normalizer is None:
            raise ModelNotReady(f"model {self._spec.name!r} is not loaded")
        return DeviceSlot(package, self._normalizer)

    # -- description ----------------------------------------------------------------------
    def output_names(self, mode: str) -> tuple[str, ...]:
        """Output tensor names a (resolved) mode returns, primary first."""
        names = self._output_names.get(mode)
        if names is None:
            names = self._output_names[mode] = tuple(o.name for o in self.family.outputs(mode))
        return names

    def get_metadata(self) -> dict[str, Any]:
        """Name, inputs/outputs, spec, provenance, batching, limits and start-up phases."""
        package = self.served.package
        inputs = self.get_input_types()
        names = {i["name"] for i in inputs}
        return {
            "name": self.name,
            "spec": self._spec.to_dict(),
            "inputs": inputs,
            "outputs": self.get_output_types(),
            # jpeg: jpeg_tiles decoded here, larger boxes resized with the spec's filter
            "transports": ["pixels", *(["jpeg"] if "jpeg_tiles" in names else [])],
            "jpeg_decode": self.served.jpeg_decode,
            "checkpoint": str(self._checkpoint),
            "device": str(self._device),
            "forward_runner": package.forward_runner if package else "",
            "package_metadata": dict(package.metadata) if package else {},
            "package_sha256": package.sha256 if package else "",
            **config_facts(package),  # build_key, weights_sha256, package_choice
            "batching": asdict(self._options.batching),
            "limits": asdict(self._options.limits),
            "preprocess_workers": self._options.preprocess_workers,
            "startup_seconds": self._phases.as_dict(),
            **self.family.metadata(),
        }

    def get_input_types(self) -> list[dict[str, Any]]:
        """V2 metadata of the inputs a request may carry (the family's)."""
        return self.family.input_types()

    def get_output_types(self) -> list[dict[str, Any]]:
        """V2 metadata of every output the model can return (the family's ``outputs()``)."""
        return [o.as_v2() for o in self.family.outputs()]

    def _count(self, outcome: str, n: int) -> None:
        if self._metrics is not None:
            self._metrics.count_tiles(outcome, n)
