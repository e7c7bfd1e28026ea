""":class:`TileHooks`: every hook :class:`~predictor.model.base.BaseServerModel` calls, with defaults.

The defaults are an embedding backbone's, so ``BaseServerModel`` serves
one as is: a square RGB tile in, normalised on the device, one package
forward per batch, one ``embedding [D]`` row per tile out. A model author
(or a family in :mod:`predictor.families`) subclasses ``BaseServerModel``
and overrides the seed's hooks, calling ``super()`` where the defaults serve:

* stage 1, per tile in a thread pool: :meth:`~TileHooks.prepare_sample`
  (and :meth:`~TileHooks.preprocess_bulk_rna`); a ``ValueError`` there is a
  400 for that request only;
* stage 2, per batch on one device worker: :meth:`~TileHooks.forward_batch`,
  built from :meth:`~TileHooks.batch_inputs`,
  :meth:`~TileHooks.output_to_host` and :meth:`~TileHooks.build_responses`;
  any failure there is a 503 for that batch only;
* start-up: :meth:`~TileHooks.check_package` (the first device's package),
  :meth:`~TileHooks.bind_device` (every device's), :meth:`~TileHooks.warm_up`;
* protocol: :meth:`~TileHooks.v2_codec` (the V2 codec; tiles by default),
  :meth:`~TileHooks.request_mode` (the mode, or the one named outputs imply:
  :meth:`~TileHooks.mode_for_outputs`),
  :meth:`~TileHooks.resolve_mode` (a request's mode against the spec's);
* description: :meth:`~TileHooks.output_names` (what a mode returns),
  :meth:`~TileHooks.output_datatypes`, :meth:`~TileHooks.output_shapes`,
  :meth:`~TileHooks.get_input_types`.

Nothing here knows KServe; ``BaseServerModel`` adds it and the lifecycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from predictor.codecs.base import Codec
from predictor.codecs.images import decode_tile
from predictor.codecs.samples import ModelRequest, ModelResponse, PreparedSample, tile_hwc
from predictor.codecs.v2 import V2Codec
from predictor.device.faults import FaultHook
from predictor.device.normalizer import Normalizer, to_host, unshared
from predictor.device.slot import DeviceSlot
from predictor.device.workers import DeviceWorkers
from predictor.errors import InvalidInput, ModelNotReady
from predictor.model.device_jpeg import JpegDecodePlace, device_batch
from predictor.model.finite import FiniteCheck, non_finite_error
from predictor.model.options import ServingOptions
from predictor.model.package_hooks import PackageFamily, check_shapes
from predictor.model.served_package import ServedPackage
from predictor.pt2.loader import LoadedPackage
from predictor.pt2.probe import expected_inputs, probe_outputs
from predictor.spec import ModelSpec


class RequestHooks:
    """Protocol hooks of a served model: its V2 codec and how a request's mode resolves.

    Mixed into :class:`TileHooks`, whose constructor sets ``_spec`` and ``_options``.
    """

    _spec: ModelSpec
    _options: ServingOptions

    def v2_codec(self, model_name: str) -> Codec:
        """The V2 codec (REST and gRPC) for this model: per-tile inputs by default."""
        limits, types = self._options.limits, self.output_datatypes()
        return V2Codec(self._spec, limits, model_name=model_name, datatypes=types)

    def request_mode(self, mode: str | None, requested: Sequence[str] | None) -> str:
        """A request's mode: as given, else the one its named outputs imply, else the default.

        The V2 convention: a request that names outputs need not name a
        mode; one that names both must name outputs the mode gives.

        Raises:
            InvalidInput: An unknown mode, outputs no mode gives, or a mode
                and named outputs that conflict (naming both).
        """
        if not requested:
            return self.resolve_mode(mode)
        if mode is None:
            return self.mode_for_outputs(requested)
        resolved = self.resolve_mode(mode)
        gives = self.output_names(resolved)
        others = [name for name in requested if name not in gives]
        if others:
            raise InvalidInput(
                f"mode {mode!r} gives outputs {list(gives)} but the request names outputs "
                f"{list(requested)}: name only outputs the mode gives, or leave the mode out "
                "(the named outputs then decide it)",
                input_name="parameters.mode",
            )
        return resolved

    def mode_for_outputs(self, names: Sequence[str]) -> str:
        """The mode giving every output in ``names`` with the fewest others (spec order on ties).

        Raises:
            InvalidInput: No mode gives them all (the message lists what each mode gives).
        """
        modes = self._spec.modes
        fits = [m for m in modes if set(names) <= set(self.output_names(m))]
        if not fits:
            gives = {m: list(self.output_names(m)) for m in modes}
            raise InvalidInput(
                f"outputs {list(names)} not produced by any mode of this model; "
                f"the modes give {gives}"
            )
        return min(fits, key=lambda m: len(self.output_names(m)))

    def resolve_mode(self, mode: str | None) -> str:
        """The request's mode, or the spec's default when it names none.

        Raises:
            InvalidInput: A mode the model does not support (``parameters.mode``).
        """
        spec = self._spec
        if mode is None:
            return spec.default_mode
        if mode not in spec.modes:
            name = self._options.name or spec.name
            raise InvalidInput(
                f"unknown mode {mode!r}; model {name!r} supports {list(spec.modes)}",
                input_name="parameters.mode",
            )
        return mode


class TileHooks(RequestHooks, ServedPackage, PackageFamily):
    """The seed's tile model without KServe: its hooks, state and defaults.

    Args:
        model_spec: The model specification (tile size, normalisation, ...).
        options: Batching, limits and naming; see :class:`ServingOptions`.
        fault_hook: Test-only forward fault injection; ``None`` in production.
        package: The first device's package, already loaded, or ``None``
            until :meth:`BaseServerModel.load` loads it.
    """

    def __init__(
        self,
        model_spec: ModelSpec,
        options: ServingOptions,
        fault_hook: FaultHook | None,
        package: LoadedPackage | None,
    ) -> None:
        self._spec = model_spec
        self._options = options
        self._fault_hook = fault_hook
        self._package = package
        self._owner_config: Mapping[str, Any] = {}  # a front end's: the device owner's config
        self._jpeg: JpegDecodePlace | None = None  # set by load only when tiles decode on a device
        self._normalizer: Normalizer | None = None  # the first device's, built by load
        # the further devices' slots, and each worker's (warmed up on CUDA)
        self._devices = DeviceWorkers(warm_up=self.warm_worker)

    @property
    def model_spec(self) -> ModelSpec:
        """The model's specification (tile size, normalisation, etc.)."""
        return self._spec

    def active_slot(self) -> DeviceSlot:
        """The calling worker's package, normaliser and stream (the model's own off a worker).

        Raises:
            ModelNotReady: Not loaded yet, or stopped.
        """
        slot = self._devices.current()
        if slot is not None:
            return slot
        if self._package is None or self._normalizer is None:
            raise ModelNotReady(f"model {self._spec.name!r} is not loaded")
        return DeviceSlot(self._package, self._normalizer)

    # -- start-up ---------------------------------------------------------------------------
    def check_package(self, package: LoadedPackage) -> list[tuple[int, ...]]:
        """Checks the first device's package against the spec (default: :meth:`bind_device`).

        A family reads its assets here (e.g. gene lists beside the package).

        Returns:
            The probed per-tile output shapes, primary first.

        Raises:
            SpecMismatch: The package disagrees with the spec.
        """
        return self.bind_device(package)

    def bind_device(self, package: LoadedPackage) -> list[tuple[int, ...]]:
        """Probes one device's package and checks its outputs against the spec.

        Called once per loaded package (one per GPU under ``--device auto``),
        so every device is probed before the pod turns ready; the device
        layer builds each device's slot (:func:`predictor.device.slot.build_slot`).

        Raises:
            SpecMismatch: The package disagrees with the spec.
        """
        probed = probe_outputs(package, self._spec, self.extra_input_shapes(package))
        shapes = [tuple(s) for s in probed]
        check_shapes(type(self), self._spec, shapes)
        return shapes

    def load_assets(self, root: Path) -> None:
        """Reads what stage 1 and the description need from beside the package (nothing by default).

        Called before the package is checked, and by a front end
        (``--frontends``), which never loads the package: state that
        ``prepare_sample`` or ``output_shapes`` read (e.g. gene lists) is set here.
        """

    def extra_input_shapes(self, package: LoadedPackage) -> Mapping[str, int]:
        """Per-tile sizes of the package's inputs after the tiles (none by default)."""
        return {}

    def warm_up(self, package: LoadedPackage) -> None:
        """Runs before the first request; nothing by default beyond the probe's two forwards."""

    def warm_worker(self, slot: DeviceSlot, batch: int) -> None:
        """One forward of ``batch`` blank tiles with a worker's slot (its staging, its stream).

        Called once per device worker before the first request
        (:meth:`~predictor.device.workers.DeviceWorkers.warm`, at
        ``max_batch_size``); inputs after the tiles are zeros of the
        package's own shapes, as the probe's.
        """
        size = self._spec.tile_size
        tile = np.zeros((size, size, 3), dtype=np.uint8)
        x = slot.normalizer([tile] * batch)
        package = slot.package
        more = expected_inputs(package, self._spec, self.extra_input_shapes(package))[1:]
        extra = [torch.zeros((batch, *d.shape[1:]), dtype=d.dtype, device=x.device) for d in more]
        package(x, *extra)

    # -- stage 1 ----------------------------------------------------------------------------
    def prepare_sample(self, request: ModelRequest) -> PreparedSample:
        """Deserialises, transforms and validates one tile; a ``ValueError`` is a 400.

        Called in the stage-1 thread pool. The tile stays ``uint8 [H, W, 3]``
        (see :mod:`predictor.codecs.samples` for why HWC); a subclass may
        return the seed's ``(3, H, W)`` instead. Normalisation happens on the
        device, in the batch.

        Raises:
            InvalidInput: No image, an undecodable one, or the wrong shape.
        """
        pixels = request.pixels
        if pixels is None and request.jpeg is not None:
            if self._jpeg is not None and self._jpeg.defer(request.jpeg):
                return PreparedSample(tile=request.jpeg)  # decoded on the device, in the batch
            pixels = request.jpeg.pixels()
        if pixels is None:
            if request.image_data is None:
                raise InvalidInput("no image data")
            pixels = decode_tile(request.image_data, limits=self._options.limits)
        size = self._spec.tile_size
        if pixels.dtype != np.uint8 or pixels.shape != (size, size, 3):
            raise InvalidInput(
                f"expected a {size}x{size} RGB uint8 tile, got shape {tuple(pixels.shape)} {pixels.dtype}"
            )
        return PreparedSample(tile=pixels)

    def preprocess_bulk_rna(self, raw: Sequence[float] | np.ndarray) -> np.ndarray:
        """Applies the spec's omics transform to raw counts (``float32``; unchanged when none)."""
        values = np.asarray(raw, dtype=np.float32)
        if self._spec.bulk_rna_transform == "log1p":
            return np.log1p(values)
        return values

    # -- stage 2 ----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward_batch(
        self,
        samples: list[PreparedSample],
        requests: list[ModelRequest],
        mode: str = "prediction",
    ) -> list[ModelResponse]:
        """Runs one batch on the device: one response per sample, positionally aligned.

        Stacks, moves to the device, normalises there, runs the package and
        queues the copies back (:meth:`output_to_host`) with one finite sum per
        row and output (:class:`~predictor.model.finite.FiniteCheck`); then the
        slot settles (:meth:`~predictor.device.slot.DeviceSlot.settle`): a
        pipelined lane gives the device's turn back before it waits for the
        copies, so the responses are built while the next batch computes. Any
        failure propagates as raised: the batcher classifies it and wraps it
        once (:func:`predictor.errors.forward_failure`) for the whole batch.
        A sample whose row of any output is NaN or infinite gets a
        :class:`~predictor.errors.NonFiniteOutput` in place of its response,
        which fails its own request only (:mod:`predictor.model.finite`).

        Args:
            samples: Samples that passed :meth:`prepare_sample`.
            requests: Each sample's request (for response metadata), aligned.
            mode: ``prediction``, ``embedding`` or ``prediction_with_embedding``.
        """
        slot = self.active_slot()
        refused: Mapping[int, InvalidInput] = {}
        if self._jpeg is not None:
            samples, refused = self._jpeg.on_device(samples, slot.normalizer.device)
        if self._fault_hook is not None:
            self._fault_hook.check([s.tile for s in samples])
        inputs = self.batch_inputs(samples)
        outputs = [out[: len(samples)] for out in unshared(slot.package(*inputs), inputs)]
        finite = FiniteCheck(outputs, self.package_outputs(self._spec))
        host = [self.output_to_host(out) for out in outputs]
        slot.settle()
        responses: list[Any] = self.build_responses([t.numpy() for t in host], mode)
        for row, output in finite.bad_rows().items():
            responses[row] = non_finite_error(output, requests[row].index)
        for row, error in refused.items():  # a slide tile nvJPEG refused: its own request only
            responses[row] = error
        return responses

    @torch.inference_mode()
    def forward(self, requests: list[ModelRequest]) -> torch.Tensor:
        """Runs the model on a batch of tile requests (the seed's legacy path).

        Prepares each request, runs one forward and returns the primary
        output on the host, ``[N, ...]`` (``[N, D]`` for an embedding).

        Raises:
            InvalidInput: A request :meth:`prepare_sample` refuses.
        """
        samples = [self.prepare_sample(r) for r in requests]
        package = self.active_slot().package
        inputs = self.batch_inputs(samples)
        primary = unshared(package(*inputs)[:1], inputs)[0]
        return self.output_to_host(primary[: len(samples)])

    def batch_inputs(self, samples: Sequence[PreparedSample]) -> tuple[torch.Tensor, ...]:
        """The package's inputs for a batch, on the device (tiles first, either layout)."""
        size = self._spec.tile_size
        normalizer = self.active_slot().normalizer
        if self._jpeg is not None:  # tiles decoded on the device (predictor.model.device_jpeg)
            on_device = device_batch([s.tile for s in samples], size, normalizer.device)
            if on_device is not None:
                return (normalizer.normalise(on_device),)
        return (normalizer([tile_hwc(s.tile, size) for s in samples]),)

    def output_to_host(self, output: torch.Tensor) -> torch.Tensor:
        """Device output (trimmed to the real batch) to a host tensor; fp32 by default.

        The copy may only be queued (:func:`~predictor.device.normalizer.to_host`,
        non-blocking into pinned memory): :meth:`forward_batch` reads the
        result after the slot settles. An override that calls ``.cpu()``
        is correct too, only it waits with the device's turn held.
        """
        return to_host(output.float() if output.is_floating_point() else output)

    def build_responses(self, outputs: Sequence[np.ndarray], mode: str) -> list[ModelResponse]:
        """One response per sample from the host outputs (views, no copies): its embedding row."""
        return [ModelResponse({"embedding": row}) for row in outputs[0]]

    # -- description ------------------------------------------------------------------------
    def output_names(self, mode: str) -> tuple[str, ...]:
        """Output tensor names a mode returns, primary first."""
        return ("embedding",)

    def output_datatypes(self) -> Mapping[str, str]:
        """V2 datatype of every output the model can return."""
        return {"embedding": "FP32"}

    def output_shapes(self) -> Mapping[str, list[int]]:
        """V2 shape of every output (``-1`` for the batch axis)."""
        return {"embedding": [-1, self._spec.embedding_dim]}

    def get_input_types(self) -> list[dict[str, Any]]:
        """V2 metadata of the inputs a request may carry."""
        size = self._spec.tile_size
        return [
            {"name": "tiles", "datatype": "BYTES", "shape": [-1]},
            {"name": "pixels", "datatype": "UINT8", "shape": [-1, size, size, 3]},
            {"name": "jpeg_tiles", "datatype": "BYTES", "shape": [-1]},
            {"name": "jpeg_layout", "datatype": "INT32", "shape": [-1, 4]},
            {"name": "jpeg_boxes", "datatype": "INT32", "shape": [-1, 4]},
        ]
