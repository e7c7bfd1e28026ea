""":class:`TileFamily`: the hooks of a per-tile family, with the embedding backbone's defaults.

The defaults are an embedding backbone's: a square RGB tile in, normalised
on the device, one package forward per batch, one ``embedding [D]`` row per
tile out. A per-tile family (:mod:`predictor.families`) subclasses it,
declares what a family declares (its modes, its spec section, its demo
model; the ``embedding`` family adds nothing else) and overrides the tile
hooks it needs, calling ``super()`` where the defaults serve:

* stage 1, per tile: :meth:`~TileFamily.prepare_sample` (a ``uint8
  [H, W, 3]`` tile, or a jpeg-transport region deferred to the device);
* stage 2, per batch: :meth:`~TileFamily.forward_batch`, built from
  :meth:`~TileFamily.batch_inputs`, :meth:`~TileFamily.output_to_host` and
  :meth:`~TileFamily.build_responses`;
* start-up: :meth:`~TileFamily.extra_input_shapes` (the package's inputs
  after the tiles), the probe (:meth:`~TileFamily.bind_device`);
* outputs: :meth:`~TileFamily.outputs`, :meth:`~TileFamily.input_types`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from predictor import tracing
from predictor.codecs.base import Codec
from predictor.codecs.images import decode_tile
from predictor.codecs.samples import ModelRequest, ModelResponse, PreparedSample, tile_hwc
from predictor.codecs.v2 import V2Codec
from predictor.device.normalizer import to_host, unshared
from predictor.device.slot import DeviceSlot
from predictor.errors import InvalidInput, SpecMismatch
from predictor.model.device_jpeg import device_batch
from predictor.model.family import Family, OutputSpec, check_shapes
from predictor.model.finite import FiniteCheck, non_finite_error
from predictor.runtime.loader import LoadedPackage
from predictor.runtime.probe import expected_inputs, probe_outputs
from predictor.spec import ModelSpec


class TileFamily(Family):
    """A per-tile family, with the embedding backbone's hooks (``h0-mini``, ``h0``, ``h1``).

    The ``embedding`` family (:mod:`predictor.families.embedding`) is these
    hooks plus its declaration and demo model.
    """

    PACKAGE_INPUTS: ClassVar[tuple[str, ...]] = ("tiles",)
    PACKAGE_OUTPUTS: ClassVar[tuple[str, ...]] = ("embedding",)
    CROSSES_PROCESSES: ClassVar[bool] = True

    # -- package (class-level) --------------------------------------------------------
    @classmethod
    def check_outputs(
        cls, spec: ModelSpec, shapes: Sequence[tuple[int, ...]], prediction_dim: int | None
    ) -> None:
        """One embedding ``[spec.embedding_dim]`` per tile."""
        check_embedding_shape(spec, shapes[0])

    @classmethod
    def example_inputs(
        cls, spec: ModelSpec, batch: int, *, genes_in: int | None, seed: int
    ) -> tuple[torch.Tensor, ...]:
        """Normalised float tiles ``[batch, 3, T, T]``."""
        gen = torch.Generator().manual_seed(seed)
        size = spec.tile_size
        return (torch.randn(batch, 3, size, size, generator=gen),)

    # -- start-up ---------------------------------------------------------------------
    def bind_device(self, package: LoadedPackage) -> list[tuple[int, ...]]:
        """Probes one device's package at batches of 1 and 2 and checks its outputs.

        Called once per loaded package (one per GPU under ``--device auto``),
        so every device is probed before the pod turns ready.

        Raises:
            SpecMismatch: The package disagrees with the spec.
        """
        probed = probe_outputs(package, self.spec, self.extra_input_shapes(package))
        shapes = [tuple(s) for s in probed]
        check_shapes(type(self), self.spec, shapes)
        return shapes

    def extra_input_shapes(self, package: LoadedPackage) -> Mapping[str, int]:
        """Per-tile sizes of the package's inputs after the tiles (none by default)."""
        return {}

    def warm_worker(self, slot: DeviceSlot, batch: int) -> None:
        """One forward of ``batch`` blank tiles with a worker's slot (its staging, its stream).

        Called once per device worker before the first request
        (:meth:`~predictor.device.workers.DeviceWorkers.warm`, at
        ``max_batch_size``); inputs after the tiles are zeros of the
        package's own shapes, as the probe's.
        """
        size = self.spec.tile_size
        tile = np.zeros((size, size, 3), dtype=np.uint8)
        x = slot.normalizer([tile] * batch)
        package = slot.package
        more = expected_inputs(package, self.spec, self.extra_input_shapes(package))[1:]
        extra = [torch.zeros((batch, *d.shape[1:]), dtype=d.dtype, device=x.device) for d in more]
        package(x, *extra)

    # -- decode and stage 1 -----------------------------------------------------------
    def v2_codec(self, model_name: str) -> Codec:
        """The V2 codec (REST and gRPC): per-tile inputs."""
        types = {o.name: o.datatype for o in self.outputs()}
        return V2Codec(self.spec, self.options.limits, model_name=model_name, datatypes=types)

    def prepare_sample(self, request: ModelRequest) -> PreparedSample:
        """Deserialises, transforms and validates one tile.

        The tile stays ``uint8 [H, W, 3]`` (see :mod:`predictor.codecs.samples`
        for why HWC). Normalisation happens on the device, in the batch. A
        jpeg-transport region is only checked here when its tiles decode on
        the device (:mod:`predictor.model.device_jpeg`).

        Raises:
            InvalidInput: No image, an undecodable one, or the wrong shape.
        """
        pixels = request.pixels
        if pixels is None and request.jpeg is not None:
            jpeg = self.served.jpeg
            if jpeg is not None and jpeg.defer(request.jpeg):
                return PreparedSample(tile=request.jpeg)  # decoded on the device, in the batch
            pixels = request.jpeg.pixels()
        if pixels is None:
            if request.image_data is None:
                raise InvalidInput("no image data")
            pixels = decode_tile(request.image_data, limits=self.options.limits)
        size = self.spec.tile_size
        if pixels.dtype != np.uint8 or pixels.shape != (size, size, 3):
            raise InvalidInput(
                f"expected a {size}x{size} RGB uint8 tile, got shape {tuple(pixels.shape)} {pixels.dtype}"
            )
        return PreparedSample(tile=pixels)

    # -- stage 2 ----------------------------------------------------------------------
    def forward_batch(
        self,
        samples: list[PreparedSample],
        requests: list[ModelRequest],
        mode: str,
        slot: DeviceSlot,
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
        """
        refused: Mapping[int, InvalidInput] = {}
        jpeg = self.served.jpeg
        if jpeg is not None:
            samples, refused = jpeg.on_device(samples, slot.normalizer.device)
        if self.fault_hook is not None:
            self.fault_hook.check([s.tile for s in samples])
        with tracing.span("h2d"):
            inputs = self.batch_inputs(samples, slot)
        with tracing.span("forward"):
            outputs = [out[: len(samples)] for out in unshared(slot.package(*inputs), inputs)]
            finite = FiniteCheck(outputs, self.package_outputs(self.spec))
            host = [self.output_to_host(out) for out in outputs]
            slot.settle()
        responses: list[Any] = self.build_responses([t.numpy() for t in host], mode)
        for row, output in finite.bad_rows().items():
            responses[row] = non_finite_error(output, requests[row].index)
        for row, error in refused.items():  # a slide tile nvJPEG refused: its own request only
            responses[row] = error
        return responses

    def forward_primary(self, samples: list[PreparedSample], slot: DeviceSlot) -> torch.Tensor:
        """The primary output of one forward, on the host (the seed's legacy ``forward``)."""
        inputs = self.batch_inputs(samples, slot)
        primary = unshared(slot.package(*inputs)[:1], inputs)[0]
        return self.output_to_host(primary[: len(samples)])

    def batch_inputs(
        self, samples: Sequence[PreparedSample], slot: DeviceSlot
    ) -> tuple[torch.Tensor, ...]:
        """The package's inputs for a batch, on the device (tiles first, either layout)."""
        size = self.spec.tile_size
        normalizer = slot.normalizer
        if self.served.jpeg is not None:  # tiles decoded on the device (model.device_jpeg)
            on_device = device_batch([s.tile for s in samples], size, normalizer.device)
            if on_device is not None:
                return (normalizer.normalise(on_device),)
        return (normalizer([tile_hwc(s.tile, size) for s in samples]),)

    def output_to_host(self, output: torch.Tensor) -> torch.Tensor:
        """Device output (trimmed to the real batch) to a host tensor; fp32 by default.

        The copy may only be queued (:func:`~predictor.device.normalizer.to_host`,
        non-blocking into pinned memory): :meth:`forward_batch` reads the
        result after the slot settles.
        """
        return to_host(output.float() if output.is_floating_point() else output)

    def build_responses(self, outputs: Sequence[np.ndarray], mode: str) -> list[ModelResponse]:
        """One response per sample from the host outputs (views, no copies): its embedding row."""
        return [ModelResponse({"embedding": row}) for row in outputs[0]]

    # -- outputs ----------------------------------------------------------------------
    def outputs(self, mode: str | None = None) -> tuple[OutputSpec, ...]:
        """One ``embedding`` ``FP32 [-1, D]`` whatever the mode."""
        return (OutputSpec("embedding", "FP32", (-1, self.spec.embedding_dim)),)

    def input_types(self) -> list[dict[str, Any]]:
        """V2 metadata of the inputs a tile request may carry (every transport)."""
        size = self.spec.tile_size
        return [
            {"name": "tiles", "datatype": "BYTES", "shape": [-1]},
            {"name": "pixels", "datatype": "UINT8", "shape": [-1, size, size, 3]},
            {"name": "jpeg_tiles", "datatype": "BYTES", "shape": [-1]},
            {"name": "jpeg_layout", "datatype": "INT32", "shape": [-1, 4]},
            {"name": "jpeg_boxes", "datatype": "INT32", "shape": [-1, 4]},
        ]


def check_embedding_shape(spec: ModelSpec, shape: tuple[int, ...]) -> None:
    """A per-tile embedding must be ``[spec.embedding_dim]`` (shared with multimodal).

    Raises:
        SpecMismatch: Not a vector, or of another width.
    """
    if len(shape) != 1:
        raise SpecMismatch(
            f"spec {spec.name!r} expects a per-tile embedding vector but the package returns shape {list(shape)}"
        )
    if shape[0] != spec.embedding_dim:
        raise SpecMismatch(
            f"spec {spec.name!r} says embedding_dim {spec.embedding_dim} but the package returns {shape[0]}"
        )
