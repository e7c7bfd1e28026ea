"""``BaseServerModel``: the seed's server model, one class for every family, a thin KServe adapter.

KServe serves a ``Model``; this one holds three parts and hands every call to
one of them:

* its **family** (:class:`~predictor.model.family.Family`, the hooks that
  differ per family: the registry's for the spec's family);
* its **package side** (:mod:`predictor.model.device_side`): the package and
  the devices in this process (:class:`~predictor.model.device_side.DeviceSide`,
  loaded by :meth:`BaseServerModel.load`), or, in a front end
  (``--frontends``), the device owner (:class:`~predictor.model.device_side.OwnerSide`,
  said at construction with a :class:`FrontEnd`): it gives the batcher and
  says what ``/config`` says of the package;
* its **pipeline** (:class:`~predictor.model.pipeline.Pipeline`): admission,
  the codecs, the decode pool, the batcher and the answer, a request's whole
  path. A request enters it through :meth:`BaseServerModel.__call__` and
  never comes back into this class.

The seed's extension API is this class's: a model author subclasses it and
overrides ``prepare_sample`` and ``forward_batch(samples, requests, mode)``
(the seed's signatures), and ``preprocess_bulk_rna``, calling ``super()``
where the family's defaults serve; ``python -m predictor --model_class
MODULE:CLASS`` serves such a subclass. The pipeline's decode pool calls the
model's ``prepare_sample`` and the device workers its ``forward_batch`` when
the class overrides them, the family's own otherwise. KServe's
``preprocess``, ``predict`` and ``postprocess`` stay callable here (KServe's
own ``Model.__call__`` uses them for anything but a plain predict). See
``docs/architecture.md`` for the whole walk.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from predictor.batching.batcher import Batcher
from predictor.codecs.samples import ModelRequest, ModelResponse, PreparedSample
from predictor.config import BatchingConfig, LimitsConfig
from predictor.device.faults import FaultHook
from predictor.device.slot import DeviceSlot
from predictor.errors import SpecError
from predictor.kserve.compat import InferenceVerb, InferRequest, InferResponse, Model
from predictor.model.device_side import DeviceSide, FrontEnd, OwnerSide
from predictor.model.family import registry_family
from predictor.model.metrics import Metrics
from predictor.model.options import ServingOptions
from predictor.model.pipeline import Pipeline, Prepared
from predictor.model.served_package import ServedPackage
from predictor.model.tiles import TileFamily
from predictor.packages.phases import StartupPhases
from predictor.runtime.loader import LoadedPackage
from predictor.spec import ModelSpec

__all__ = ["MODEL_ROOT", "BaseServerModel", "FrontEnd", "ServingOptions"]

logger = logging.getLogger("histoserve")

MODEL_ROOT = Path("/opt/ml/model")


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
        front_end: Set in a front end (:mod:`predictor.multiprocess`): stage 1
            runs here, the package is never loaded in this process (``load``
            reads only the family's assets).

    The family whose hooks serve the spec is the registry's
    (:func:`predictor.families.family_for`, which checks the spec's family
    part through it); it is handed the seed hooks it names that this class
    overrides, so a subclass's override is what it calls.

    Raises:
        SpecError: The spec names no family of the registry, or fails its family's check.
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
        front_end: FrontEnd | None = None,
    ):
        family = registry_family(model_spec)
        options = family.serving_options(options or ServingOptions(), package)
        Model.__init__(self, options.name or model_spec.name)
        self._spec = model_spec
        self._options = options
        self._stopped = False
        checkpoint = Path(model_root) / checkpoint_name
        if front_end is None:
            served = ServedPackage(package)
        else:
            served = ServedPackage.from_owner(front_end.owner_config)
        self.family = family(
            model_spec,
            options,
            served,
            fault_hook,
            seed_hooks={name: hook for name in family.SEED_HOOKS if (hook := self._own_hook(name))},
        )
        self.device_side: DeviceSide | OwnerSide
        if front_end is None:
            self.device_side = DeviceSide(
                self.name,
                model_spec,
                options,
                self.family,
                served,
                checkpoint=checkpoint,
                device=torch.device(device),
                more_packages=more_packages,
                metrics=metrics,
                phases=package.phases if package is not None else StartupPhases(),
                forward_batch=self._own_hook("forward_batch"),
                served_by=f"{type(self).__module__}.{type(self).__qualname__}",
            )
        else:
            self.device_side = OwnerSide(front_end, self.family, served, checkpoint.parent)
        self.pipeline = Pipeline(
            self.name,
            model_spec,
            options,
            self.family,
            served,
            self.device_side,
            self._own_hook("prepare_sample") or self.family.prepare_sample,
            metrics,
        )
        self._checkpoint = checkpoint
        self._device = torch.device(device)

    def _own_hook(self, name: str) -> Any:
        """This model's bound hook ``name`` when its class overrides the seed's, else None.

        A hook a class does not override is the family's, called by the
        pipeline and the device workers directly.
        """
        if getattr(type(self), name) is getattr(BaseServerModel, name):
            return None
        return getattr(self, name)

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
        """The device the package runs on (a front end's: the one it was built with)."""
        return self._device

    @property
    def batching(self) -> BatchingConfig:
        """The batching this model serves with: the flags as its family resolved them
        (a slide head's one slide a batch), the one value every part reads."""
        return self._options.batching

    @property
    def limits(self) -> LimitsConfig:
        """The input limits this model serves with."""
        return self._options.limits

    @property
    def served(self) -> ServedPackage:
        """What answers say of the served package (the package side's)."""
        return self.device_side.served

    # -- lifecycle ------------------------------------------------------------------------
    def load(self) -> bool:
        """Loads the package side (a front end: the family's assets only) and the decode pool.

        Raises a :class:`~predictor.errors.StartupError` on any problem. The
        package is hashed once: here only when the constructor got none.
        Idempotent: KServe calls ``load`` again whenever the model reports not
        ready (e.g. while draining), which must not reload anything.
        """
        if self._stopped:
            return False
        if not self.pipeline.open:
            self.device_side.load()
            self.pipeline.open_pool()
        self.ready = not self.pipeline.draining
        return self.ready

    async def start_batching(self) -> None:
        """Starts the batcher inside the running event loop (called by the server)."""
        await self.pipeline.start()

    async def drain(self, timeout_s: float, why: str = "shutdown") -> bool:
        """Turns readiness false, refuses new work and waits for admitted work (the pipeline's)."""
        self.ready = False
        return await self.pipeline.drain(timeout_s, why)

    async def healthy(self) -> bool:
        """Ready for traffic: loaded, not draining, device usable."""
        return bool(self.ready and not self.pipeline.draining and self.live)

    @property
    def live(self) -> bool:
        """False once a sticky device error made the device unusable."""
        return self.pipeline.live

    @property
    def batcher(self) -> Batcher | None:
        """The running batcher (None before :meth:`start_batching`): the device owner's seam."""
        return self.pipeline.batcher

    def stop(self) -> None:
        """Closes the batcher and releases the decode pool and the package for good.

        Call on the serving loop's thread (the server's shutdown does), or
        after it ended. Whatever is still queued fails with ``ModelNotReady``
        and the device worker threads end (drain first for a graceful stop).
        Dropping the package runs its loader's destructor now, which deletes the
        files it extracted, so the process can exit without a full garbage
        collection (see ``predictor.__main__``).
        """
        self.ready = False
        self._stopped = True
        self.pipeline.stop()
        self.device_side.stop()

    # -- kserve entry points --------------------------------------------------------------
    async def __call__(self, body: Any, headers: dict[str, str] | None = None, verb: Any = None):
        """A predict goes to the pipeline (its stages timed as KServe times them, by
        :class:`~predictor.kserve.stage_call.StageCall`); explain, and a model asked for
        response headers, go through KServe's own ``Model.__call__``, so they answer as
        they always did."""
        if (verb is not None and verb != InferenceVerb.PREDICT) or self.required_response_headers:
            with self.pipeline.admitted():
                return await super().__call__(body, headers, verb or InferenceVerb.PREDICT)
        return await self.pipeline(body, headers, self.enable_latency_logging)

    def validate(self, payload: Any) -> Any:
        """Codecs validate; KServe's dict checks would misread our payload."""
        return payload

    async def preprocess(
        self, payload: dict | InferRequest, headers: dict[str, str] | None = None
    ) -> Prepared:
        """Stage 1 (the pipeline's): pick the codec, decode, prepare every tile; 400 on bad input."""
        return await self.pipeline.preprocess(payload, headers)

    async def predict(
        self, payload: Prepared, headers: dict[str, str] | None = None
    ) -> tuple[Prepared, list[ModelResponse]]:
        """Stage 2 (the pipeline's): enqueue the samples, one response per tile, in order."""
        return await self.pipeline.predict(payload, headers)

    async def postprocess(
        self, result: tuple[Prepared, list[ModelResponse]], headers: dict[str, str] | None = None
    ) -> dict | InferResponse:
        """Encodes the responses with the codec the request was decoded with (the pipeline's)."""
        return await self.pipeline.postprocess(result, headers)

    # -- the seed's hooks: the family's, overridable ---------------------------------------
    def prepare_sample(self, request: ModelRequest) -> PreparedSample:
        """Deserialises, transforms and validates one tile; a ``ValueError`` is a 400.

        Called in the stage-1 thread pool when a subclass overrides it (else
        the pipeline calls the family's,
        :meth:`~predictor.model.family.Family.prepare_sample`, directly). A
        tile family hands the tile over as ``uint8 [H, W, 3]``; a subclass may
        return the seed's ``(3, H, W)`` instead. Normalisation happens on the device.
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
        on the worker's slot (:meth:`active_slot`); the device workers call
        it when a subclass overrides it, the family's directly otherwise. Any
        failure propagates as raised: the batcher classifies it and fails the
        batch (503); a response that is an exception fails its own request only.

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

        The seed's hook: the family's own (the multimodal family's
        ``preprocess_bulk_rna``). A subclass overriding it is what stage 1
        applies to every request's counts (its ``ValueError`` is that request's 400).
        """
        own = getattr(self.family, "preprocess_bulk_rna", None)
        return np.asarray(raw, dtype=np.float32) if own is None else own(raw)

    def active_slot(self) -> DeviceSlot:
        """The calling worker's package, normaliser and stream (the model's own off a worker).

        Raises:
            ModelNotReady: Not loaded yet, or stopped (or a front end: no device here).
        """
        return self.device_side.active_slot()

    # -- description ----------------------------------------------------------------------
    def output_names(self, mode: str) -> tuple[str, ...]:
        """Output tensor names a (resolved) mode returns, primary first."""
        return self.pipeline.output_names(mode)

    def get_metadata(self) -> dict[str, Any]:
        """Name, inputs/outputs, spec, batching, limits, then the package side's facts
        (provenance, device, start-up phases; a front end: the device owner's whole answer)."""
        inputs = self.get_input_types()
        names = {i["name"] for i in inputs}
        facts = {
            "name": self.name,
            "spec": self._spec.to_dict(),
            "inputs": inputs,
            "outputs": self.get_output_types(),
            # jpeg: jpeg_tiles decoded here, larger boxes resized with the spec's filter
            "transports": ["pixels", *(["jpeg"] if "jpeg_tiles" in names else [])],
            "batching": asdict(self._options.batching),
            "limits": asdict(self._options.limits),
            "preprocess_workers": self._options.preprocess_workers,
            **self.family.metadata(),
        }
        return {**facts, **self.device_side.describe()}

    def get_input_types(self) -> list[dict[str, Any]]:
        """V2 metadata of the inputs a request may carry (the family's)."""
        return self.family.input_types()

    def get_output_types(self) -> list[dict[str, Any]]:
        """V2 metadata of every output the model can return (the family's ``outputs()``)."""
        return [o.as_v2() for o in self.family.outputs()]
