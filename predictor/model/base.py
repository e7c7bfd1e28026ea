"""``BaseServerModel``: the seed's server model, served as is for embedding backbones.

It is the tile model: every hook it calls is declared, with the embedding
backbone's default, on its base :class:`~predictor.model.hooks.TileHooks`
(and the class-level ones on :class:`~predictor.model.package_hooks.PackageFamily`);
this module adds KServe and the lifecycle. A model author, or a family
(:mod:`predictor.families`), subclasses it and overrides ``prepare_sample``
and ``forward_batch`` (the seed's signatures), calling ``super()`` where the
defaults serve; ``python -m predictor --model_class MODULE:CLASS`` serves
such a subclass.

KServe calls :meth:`~BaseServerModel.preprocess` (stage 1), :meth:`predict`
(stage 2) and :meth:`postprocess` on one request. Stage 1 picks the request's
codec once (V1 for a dict body, V2 for an ``InferRequest``), decodes it into
per-tile :class:`~predictor.codecs.samples.ModelRequest` items and runs
``prepare_sample`` on each in a thread pool (an error there is a 400 for that
request only). Stage 2 hands the prepared samples with their requests, and
nothing else, to the :class:`~predictor.batching.batcher.DynamicBatcher`,
which calls ``forward_batch`` on one device worker (an error there is a 503
for that batch only). The same codec encodes the responses. See
``docs/architecture.md`` for the whole walk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from predictor.batching.batcher import DynamicBatcher
from predictor.codecs.base import Codec
from predictor.codecs.samples import DecodedRequest, ModelResponse, PreparedSample
from predictor.codecs.v1 import V1Codec
from predictor.device.failures import classify_error
from predictor.device.faults import FaultHook
from predictor.device.slot import build_normalizer, build_slot
from predictor.errors import InvalidInput, ModelNotReady, Overloaded
from predictor.kserve.compat import InferenceVerb, InferRequest, InferResponse, Model
from predictor.kserve.stage_call import StageCall
from predictor.model.admission import Admission
from predictor.model.device_jpeg import JpegDecodePlace
from predictor.model.forward import BatchItem, batch_forward, item_tiles, request_tiles
from predictor.model.hooks import TileHooks
from predictor.model.metrics import Metrics
from predictor.model.options import ServingOptions
from predictor.model.stage1 import Stage1Pool
from predictor.pt2.loader import LoadedPackage, StartupPhases, inspect_package, open_package
from predictor.pt2.package_set import config_facts
from predictor.spec import ModelSpec

logger = logging.getLogger("histoserve")

MODEL_ROOT = Path("/opt/ml/model")


@dataclass
class _Prepared:
    """One request between the stages: its codec, decoded form, mode and samples."""

    codec: Codec
    decoded: DecodedRequest
    mode: str
    samples: list[PreparedSample]


class BaseServerModel(TileHooks, Model):
    """Loads an exported ``.pt2`` package and serves it over KServe with dynamic batching.

    Used directly for embedding backbones (h0-mini, h0, h1): no subclass
    needed. Override ``prepare_sample`` and ``forward_batch`` (declared with
    their defaults on :class:`~predictor.model.hooks.TileHooks`, like every
    other hook this class calls) for models that need custom input handling.

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
        batcher: A front end's stand-in for the device owner's batcher, with
            :class:`DynamicBatcher`'s contract (:mod:`predictor.multiprocess`):
            stage 1 runs here, the package is never loaded in this process
            (``load`` reads only :meth:`~TileHooks.load_assets`).
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
        batcher: Any = None,
    ):
        options = options or ServingOptions()
        TileHooks.__init__(self, model_spec, options, fault_hook, package)
        Model.__init__(self, options.name or model_spec.name)
        self._checkpoint = Path(model_root) / checkpoint_name
        self._device = torch.device(device)
        self._metrics = metrics
        self._more_packages = dict(more_packages or {})
        self._phases = package.phases if package is not None else StartupPhases()
        self._pool: Stage1Pool | None = None
        self._batcher: DynamicBatcher | None = batcher
        self._stopped = False
        self._stage_call = StageCall(self.name)
        self._v1 = V1Codec(model_spec, self._options.limits)
        self._v2 = self.v2_codec(self.name)
        batching = self._options.batching
        self._admission = Admission(
            self.name,
            batching.max_queue_size,
            batching.retry_after_s,
            on_reject=lambda n: self._count("rejected", n),
        )

    # -- identity -------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """Human-readable model identifier (the name in URLs)."""
        return self.name

    @property
    def device(self) -> torch.device:
        """The device the package runs on."""
        return self._device

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
        if self._pool is None and self._batcher is not None:  # a front end
            self.load_assets(self._checkpoint.parent)
            self._pool = Stage1Pool(self._options.preprocess_workers, self._spec.tile_size)
        if self._pool is None:
            if self._package is None:
                facts = inspect_package(self._checkpoint, self._phases)
                self._package = open_package(self._checkpoint, self._device, facts, self._phases)
            with self._phases.time("probe"):
                self.check_package(self._package)
                self._normalizer = build_normalizer(self._package, self._spec)
                place = JpegDecodePlace(
                    self._options.jpeg_decode,
                    self._package.device,
                    self._spec.tile_size,
                    self._spec.interpolation,
                )
                self._jpeg = place if place.on_device_enabled else None
                for dev, package in self._more_packages.items():
                    self.bind_device(package)
                    self._devices.slots[dev] = build_slot(package, self._spec)
            with self._phases.time("warmup"):
                self.warm_up(self._package)
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
        if self._batcher is not None and not isinstance(self._batcher, DynamicBatcher):
            await self._batcher.start()  # a front end's: the device owner holds the workers
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
            )
        await self._batcher.start()
        workers = [w.name for w in self._batcher.workers]
        logger.info("%s: %d device worker(s): %s", self.name, len(workers), ", ".join(workers))
        if self._metrics is not None:
            self._metrics.workers_started(workers)

    async def drain(self, timeout_s: float) -> bool:
        """Turns readiness false, refuses new work and waits for admitted work.

        Admitted requests still in stage 1 (decoding) have not reached the
        batcher yet, so the batcher keeps accepting their tiles until every
        admitted request has finished or the deadline passes; then the
        batcher drains whatever is left in the time that remains.
        """
        admission = self._admission
        admission.start_draining()
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
    def batcher(self) -> DynamicBatcher | None:
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
        if self._batcher is not None:
            self._batcher.close_nowait()
        if self._pool is not None:
            self._pool.shutdown()
        self._package = None
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
        codec: Codec = self._v2 if isinstance(payload, InferRequest) else self._v1
        decoded = codec.decode(payload)
        try:
            mode = self.request_mode(decoded.mode, decoded.requested_outputs)
            codec.check_outputs(decoded, self.output_names(mode))  # before any compute
            samples = await self._prepare_staged(decoded)
        except InvalidInput:
            self._count("invalid", request_tiles(decoded.items))
            raise
        if self._metrics is not None:
            self._metrics.observe_preprocess(time.monotonic() - started)
        return _Prepared(codec, decoded, mode, samples)

    async def predict(
        self, payload: _Prepared, headers: dict[str, str] | None = None
    ) -> tuple[_Prepared, list[ModelResponse]]:
        """Stage 2: enqueue the samples (with their requests) and await one response per tile, in order."""
        if self._batcher is None:
            raise ModelNotReady(f"model {self.name!r} has no running batcher")
        items = map(BatchItem, payload.samples, payload.decoded.items)
        futures = self._batcher.submit(list(items), key=payload.mode)
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
        names = self.output_names(prepared.mode)
        parameters = self.answer_parameters(prepared.samples)
        return prepared.codec.encode(prepared.decoded, responses, names, parameters)

    async def _prepare_staged(self, decoded: DecodedRequest) -> list[PreparedSample]:
        """Stage 1 for every tile, refused up front (fast 503) when the queue is full."""
        depth = self._batcher.queue_depth if self._batcher is not None else 0
        with self._admission.staged(request_tiles(decoded.items), depth):
            return await self._pool.prepare(decoded.items, decoded.tile_input, self.prepare_sample)

    # -- description ----------------------------------------------------------------------
    def get_metadata(self) -> dict[str, Any]:
        """Name, inputs/outputs, spec, provenance, batching, limits and start-up phases."""
        package = self._package
        inputs = self.get_input_types()
        names = {i["name"] for i in inputs}
        return {
            "name": self.name,
            "spec": self._spec.to_dict(),
            "inputs": inputs,
            "outputs": self.get_output_types(),
            # jpeg: jpeg_tiles decoded here, larger boxes resized with the spec's filter
            "transports": ["pixels", *(["jpeg"] if "jpeg_tiles" in names else [])],
            "jpeg_decode": self.jpeg_decode,
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
        }

    def get_output_types(self) -> list[dict[str, Any]]:
        """V2 metadata of every output, from ``output_datatypes`` and ``output_shapes``."""
        types = self.output_datatypes()
        return [
            {"name": n, "datatype": types[n], "shape": s} for n, s in self.output_shapes().items()
        ]

    def _count(self, outcome: str, n: int) -> None:
        if self._metrics is not None:
            self._metrics.count_tiles(outcome, n)
