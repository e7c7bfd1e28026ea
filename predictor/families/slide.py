"""Slide heads (the ``slide`` family): a slide's tile features in, one answer per slide out.

One V2 request is one slide (:class:`~predictor.codecs.v2_slide.SlideV2Codec`):
``features`` ``[N, D]`` (``FP32``; ``FP16`` and ``BF16`` accepted) with
optional ``coords`` ``INT64 [N, 2]``; ``D`` must be the spec's
``feature_dim`` (the width of its ``tile_encoder``'s features). The package
takes ``features [N, D]`` (``N`` its dynamic axis) and returns, in order,
``prediction [C]`` (only when the spec lists classes), ``attention [N]`` or
``[N, C]`` and ``slide_embedding [E]``.

Modes: ``prediction`` (``prediction``), ``embedding`` (``slide_embedding``),
``attention`` (``attention``), or several joined by commas
(``prediction,attention``): one forward either way
(:data:`histoserve.wire.SLIDE_MODE_OUTPUTS`, the table the client reads).
The family's spec section: ``feature_dim``, ``classes`` (exactly when the
spec has the ``prediction`` mode) and the tile encoder it follows.

Batching: one slide a forward (``max_batch_size`` is 1 slide). The queue is
bounded in tiles: a slide counts its ``N`` against ``--max_queue_size``
(raised to ``--max_tiles_per_slide`` so the largest slide fits alone), and
``N`` is bounded by ``--max_tiles_per_slide`` and the package's own range.
Stage 1 (a thread) refuses non-finite features and features beyond the
package dtype's finite range (FP16's 65504: the cast would overflow), 400
naming the tile, and casts to float32; stage 2 moves the slide to the device
in the package's dtype, runs it and checks every output finite there: NaN or
infinity is a :class:`~predictor.errors.NonFiniteOutput` for that slide
(422, never a 200).

Its demo models: :class:`GatedABMIL` (Ilse et al., 2018, "Attention-based
Deep Multiple Instance Learning", gated variant: ``prediction [C]``, the
softmax of the class logits; ``attention [N]``, a softmax over the slide's
tiles; ``slide_embedding [E]``) for a spec with classes, :class:`MeanPool`
(the uniform attention ``1/N`` and the mean of the features; no weights, no
classes) for one without.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from histoserve.wire import SLIDE_MODE_OUTPUTS, SLIDE_OUTPUTS
from predictor.codecs.base import Codec
from predictor.codecs.common import first_non_finite
from predictor.codecs.samples import ModelRequest, ModelResponse, PreparedSample
from predictor.codecs.v2_slide import COORDS, FEATURES, SlideInput, SlideV2Codec
from predictor.device.faults import FaultHook
from predictor.device.normalizer import to_host, unshared
from predictor.device.slot import DeviceSlot
from predictor.errors import InvalidInput, NonFiniteOutput, SpecError, SpecMismatch
from predictor.model.family import Family, OutputSpec
from predictor.model.finite import first_beyond, input_limit
from predictor.model.options import ServingOptions
from predictor.model.served_package import ServedPackage
from predictor.packages.metadata import provenance
from predictor.runtime.loader import LoadedPackage
from predictor.runtime.probe import format_shapes
from predictor.spec import ModelSpec

logger = logging.getLogger("histoserve")

OUTPUT_OF_MODE: Mapping[str, str] = {mode: out for mode, (out,) in SLIDE_MODE_OUTPUTS.items()}
"""Each slide mode's output tensor (the one declaration both sides read, in ``histoserve.wire``)."""

_PROBE_TILES = (1, 3)


class SlideFamily(Family):
    """A slide head: one slide's features a request, one forward a slide.

    Answers whole requests of any size (``N`` tiles), so it does not cross
    processes (``CROSSES_PROCESSES`` stays the base's ``False``).
    """

    MODE_OUTPUTS: ClassVar[Mapping[str, tuple[str, ...]]] = SLIDE_MODE_OUTPUTS
    SPEC_FIELDS: ClassVar[tuple[str, ...]] = (
        "feature_dim",
        "classes",
        "tile_encoder",
        "tile_encoder_sha256",
    )
    PACKAGE_INPUTS: ClassVar[tuple[str, ...]] = (FEATURES,)
    PACKAGE_OUTPUTS: ClassVar[tuple[str, ...]] = SLIDE_OUTPUTS
    DEFAULT_MAX_BATCH: ClassVar[int] = 200_000

    def __init__(
        self,
        spec: ModelSpec,
        options: ServingOptions,
        served: ServedPackage,
        fault_hook: FaultHook | None = None,
        seed_hooks: Mapping[str, Callable[..., Any]] | None = None,
    ) -> None:
        super().__init__(spec, options, served, fault_hook, seed_hooks)
        self._attention_shape: tuple[int, ...] = (-1,)
        self.input_limit = float(np.finfo(np.float32).max)
        """The package dtype's finite range, set by :meth:`bind_device`."""

    # -- declaration, export and start-up ----------------------------------------------
    @classmethod
    def check_spec(cls, spec: ModelSpec) -> None:
        """The slide modes, a feature width, and classes exactly with the ``prediction`` mode."""
        super().check_spec(spec)
        if spec.feature_dim <= 0:
            raise SpecError(f"spec {spec.name!r}: a slide spec needs feature_dim > 0")
        if ("prediction" in spec.modes) != bool(spec.classes):
            raise SpecError(
                f"spec {spec.name!r}: a slide spec lists classes exactly when it has the "
                f"prediction mode (modes {list(spec.modes)}, classes {list(spec.classes)})"
            )

    @classmethod
    def package_outputs(cls, spec: ModelSpec) -> tuple[str, ...]:
        return cls.PACKAGE_OUTPUTS if spec.classes else cls.PACKAGE_OUTPUTS[1:]

    @classmethod
    def recorded_shape(cls, name: str, shape: Sequence[int]) -> list[int]:
        if name in ("prediction", "slide_embedding"):
            return list(shape)
        return [-1, *shape[1:]]

    @classmethod
    def check_outputs(
        cls, spec: ModelSpec, shapes: Sequence[tuple[int, ...]], prediction_dim: int | None
    ) -> None:
        """Checks the shapes probed at ``N`` tiles (``attention``'s first axis is ``N``)."""
        check_slide_outputs(spec, shapes)

    @classmethod
    def serving_options(
        cls, options: ServingOptions, package: LoadedPackage | None
    ) -> ServingOptions:
        """One slide a forward, a queue bounded in tiles (:func:`slide_options`)."""
        return slide_options(options, package)

    @classmethod
    def build_demo(cls, spec: ModelSpec, preset: str, opts: dict[str, Any]) -> nn.Module:
        if not spec.classes:
            if spec.embedding_dim != spec.feature_dim:
                raise SpecError(
                    f"spec {spec.name!r}: mean pooling keeps the feature width, so "
                    f"embedding_dim ({spec.embedding_dim}) must be feature_dim ({spec.feature_dim})"
                )
            return MeanPool(spec.feature_dim)
        hidden = int(opts.pop("hidden", 256))
        return GatedABMIL(spec.feature_dim, spec.embedding_dim, len(spec.classes), hidden)

    @classmethod
    def example_inputs(
        cls, spec: ModelSpec, batch: int, *, genes_in: int | None, seed: int
    ) -> tuple[torch.Tensor, ...]:
        """One slide of ``batch`` tiles' features, ``[batch, D]``."""
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, spec.feature_dim, generator=gen),)

    def bind_device(self, package: LoadedPackage) -> list[tuple[int, ...]]:
        """Runs slides of 1 and 3 tiles; checks output count, shapes and finiteness."""
        names = self.package_outputs(self.spec)
        shapes = [self._probe(package, n, names) for n in _PROBE_TILES]
        check_slide_outputs(self.spec, shapes[-1])
        attention = shapes[-1][names.index("attention")]
        self._attention_shape = (-1, *attention[1:])
        self.input_limit = input_limit(package.input_dtype)
        return list(shapes[-1])

    def _probe(
        self, package: LoadedPackage, n: int, names: Sequence[str]
    ) -> tuple[tuple[int, ...], ...]:
        features = torch.zeros((n, self.spec.feature_dim), dtype=package.input_dtype)
        try:
            with torch.inference_mode():
                outputs = package(features.to(package.device))
        except Exception as exc:
            raise SpecMismatch(
                f"package {package.path.name} fails on spec {self.spec.name!r} features "
                f"[{n}, {self.spec.feature_dim}]: {exc}"
            ) from exc
        if len(outputs) != len(names):
            raise SpecMismatch(
                f"spec {self.spec.name!r} expects outputs {list(names)} but the package returns "
                f"{len(outputs)}: {format_shapes([o.shape for o in outputs])}"
            )
        for name, out in zip(names, outputs, strict=True):
            if not bool(torch.isfinite(out.float()).all()):
                raise SpecMismatch(
                    f"package {package.path.name}: output {name!r} is not finite for zero features"
                )
        return tuple(tuple(o.shape) for o in outputs)

    def warm_worker(self, slot: DeviceSlot, batch: int) -> None:
        """One forward of a small blank slide with a worker's slot."""
        package = slot.package
        features = torch.zeros((8, self.spec.feature_dim), dtype=package.input_dtype)
        package(features.to(package.device))

    # -- decode -------------------------------------------------------------------------
    def v2_codec(self, model_name: str) -> Codec:
        types = {o.name: o.datatype for o in self.outputs()}
        return SlideV2Codec(self.spec, self.options.limits, model_name=model_name, datatypes=types)

    def resolve_mode(self, mode: str | None) -> str:
        """One mode, or several joined by commas (answered from one forward, in spec order)."""
        if mode is None or "," not in mode:
            return super().resolve_mode(mode)
        parts = [part.strip() for part in mode.split(",")]
        for part in parts:
            super().resolve_mode(part)
        if len(set(parts)) != len(parts):
            raise InvalidInput(f"mode {mode!r} names a mode twice", input_name="parameters.mode")
        return ",".join(m for m in self.spec.modes if m in parts)

    def mode_for_outputs(self, names: Sequence[str]) -> str:
        """The modes of the named outputs, joined (``prediction,attention``): one forward."""
        modes = {OUTPUT_OF_MODE[m]: m for m in self.spec.modes}
        unknown = [name for name in names if name not in modes]
        if unknown:
            raise InvalidInput(
                f"no mode gives output {unknown[0]!r}; model {self.spec.name!r} gives "
                f"{list(modes)} (modes {list(self.spec.modes)})"
            )
        return ",".join(m for m in self.spec.modes if OUTPUT_OF_MODE[m] in names)

    # -- stage 1 ----------------------------------------------------------------------
    def prepare_sample(self, request: ModelRequest) -> PreparedSample:
        """The slide's features as contiguous float32 (a copy unless already writable fp32).

        The slide is the request's ``family_input``, as the slide codec decoded
        it (:class:`~predictor.codecs.v2_slide.SlideInput`).

        Raises:
            InvalidInput: No features (a V1 or tile request), or a NaN/inf feature.
        """
        slide = request.family_input
        if not isinstance(slide, SlideInput):
            raise InvalidInput(
                f"slide model {self.spec.name!r} takes V2 'features' [N, D], one slide a request",
                input_name=FEATURES,
            )
        features = slide.features
        tile = first_non_finite(features)
        if tile is not None:
            raise InvalidInput(
                f"non-finite feature (NaN or inf) at tile {tile}",
                input_name=FEATURES,
                tile=tile,
            )
        beyond = first_beyond(features, self.input_limit)
        if beyond is not None:
            raise InvalidInput(
                f"feature {beyond[1]:g} is beyond the package's finite range "
                f"(+-{self.input_limit:g}): the model would overflow",
                input_name=FEATURES,
                tile=beyond[0],
            )
        copy = features.dtype != np.float32 or not features.flags.writeable
        x = np.array(features, dtype=np.float32, order="C") if copy else features
        extra = {} if slide.coords is None else {COORDS: slide.coords}
        return PreparedSample(tile=np.ascontiguousarray(x), extra_tensors=extra)

    # -- stage 2 ----------------------------------------------------------------------
    def forward_batch(
        self,
        samples: list[PreparedSample],
        requests: list[ModelRequest],
        mode: str,
        slot: DeviceSlot,
    ) -> list[ModelResponse]:
        """One package forward per slide (the batcher hands one slide a batch)."""
        if self.fault_hook is not None:
            self.fault_hook.check([s.tile for s in samples])
        package = slot.package
        names = self.package_outputs(self.spec)
        wanted = [OUTPUT_OF_MODE[part] for part in mode.split(",")]
        responses = []
        for sample in samples:
            x = torch.from_numpy(sample.tile).to(package.device, dtype=package.input_dtype)
            slot.staged(x)  # a lane computes in turn, as for tiles
            outputs = unshared(package(x.contiguous()), [x])
            check_finite(dict(zip(names, outputs, strict=True)))
            host = {n: to_host(o.float()) for n, o in zip(names, outputs, strict=True)}
            slot.settle()
            responses.append(ModelResponse({n: host[n].numpy() for n in wanted}))
        return responses

    # -- outputs ------------------------------------------------------------------------
    def outputs(self, mode: str | None = None) -> tuple[OutputSpec, ...]:
        """``prediction [C]`` (with classes), ``attention [N]`` or ``[N, C]``, ``slide_embedding [E]``.

        FP32 each; a mode (or modes joined by commas) returns its outputs in its order.
        """
        spec = self.spec
        every = {
            "prediction": OutputSpec("prediction", "FP32", (len(spec.classes),)),
            "attention": OutputSpec("attention", "FP32", self._attention_shape),
            "slide_embedding": OutputSpec("slide_embedding", "FP32", (spec.embedding_dim,)),
        }
        if mode is None:
            return tuple(every[name] for name in self.package_outputs(spec))
        return tuple(every[OUTPUT_OF_MODE[part]] for part in mode.split(","))

    def input_types(self) -> list[dict[str, Any]]:
        return [
            {"name": FEATURES, "datatype": "FP32", "shape": [-1, self.spec.feature_dim]},
            {"name": COORDS, "datatype": "INT64", "shape": [-1, 2]},
        ]

    def metadata(self) -> Mapping[str, Any]:
        spec = self.spec
        encoder = {
            "name": spec.tile_encoder,
            "feature_dim": spec.feature_dim,
            "package_sha256": spec.tile_encoder_sha256,
        }
        return {
            "classes": list(spec.classes),
            "tile_encoder": encoder,
            "max_tiles_per_slide": self.options.limits.max_tiles_per_slide,
        }


def check_finite(outputs: Mapping[str, torch.Tensor]) -> None:
    """NonFiniteOutput naming the first output (and attention's tile) with a NaN or infinity.

    Checked on the device, one reduction per output: only a failed slide
    copies anything more.
    """
    for name, out in outputs.items():
        if bool(torch.isfinite(out).all()):
            continue
        where = ""
        if name == "attention":
            rows = (~torch.isfinite(out)).reshape(out.shape[0], -1).any(dim=1)
            where = f" at tile {int(torch.nonzero(rows)[0, 0])}"
        raise NonFiniteOutput(
            f"output {name!r} is not finite (NaN or infinity){where}: the model overflowed on "
            "this slide's features (a package exported in FP16 or BF16, or features out of "
            "the range it was trained on); the same input fails on every replica"
        )


def slide_options(options: ServingOptions, package: LoadedPackage | None) -> ServingOptions:
    """``options`` for one slide a forward, a queue bounded in tiles, ``N`` within the package.

    ``max_batch_size`` becomes 1 (slide); ``max_tiles_per_slide`` at most the
    package's exported ``N`` range; ``max_queue_size`` (tiles) at least that,
    so the largest slide fits in an empty queue. Logged when changed.
    """
    limits, batching = options.limits, options.batching
    most = limits.max_tiles_per_slide
    if package is not None:
        most = min(most, int(provenance(package.metadata).get("max_batch", most)))
    queue = max(batching.max_queue_size, most)
    new_batching = dataclasses.replace(batching, max_batch_size=1, max_queue_size=queue)
    new_limits = dataclasses.replace(limits, max_tiles_per_slide=most)
    if (new_batching, new_limits) != (batching, limits):
        logger.info(
            "slide model: one slide a forward (max_batch_size 1), max_queue_size %d tiles, "
            "at most %d tiles a slide",
            queue,
            most,
        )
    return dataclasses.replace(options, batching=new_batching, limits=new_limits)


def check_slide_outputs(spec: ModelSpec, shapes: Sequence[tuple[int, ...]]) -> None:
    """Probed shapes: ``prediction [C]``, ``attention [N]`` or ``[N, C]``, ``slide_embedding [E]``.

    Raises:
        SpecMismatch: One line naming the spec, the expectation and the package's value.
    """
    named = dict(zip(SlideFamily.package_outputs(spec), shapes, strict=False))
    classes = len(spec.classes)
    if spec.classes and named.get("prediction") != (classes,):
        raise SpecMismatch(
            f"spec {spec.name!r} lists {classes} classes but the package's prediction is "
            f"{list(named.get('prediction', ()))}"
        )
    attention = named.get("attention", ())
    if len(attention) not in (1, 2) or (len(attention) == 2 and attention[1] != classes):
        raise SpecMismatch(
            f"spec {spec.name!r} expects attention [N] or [N, {classes}], got {list(attention)}"
        )
    if named.get("slide_embedding") != (spec.embedding_dim,):
        raise SpecMismatch(
            f"spec {spec.name!r} says embedding_dim {spec.embedding_dim} but the package's "
            f"slide_embedding is {list(named.get('slide_embedding', ()))}"
        )


FAMILY = SlideFamily
"""The ``slide`` family's hooks (the registry: :func:`predictor.families.family_for`)."""


# -- the demo models --------------------------------------------------------------------


class GatedABMIL(nn.Module):
    """Gated-attention MIL pooling with a linear classifier (random weights for the demo).

    ``h = relu(W f)``; ``a = softmax_n(w . (tanh(V h) * sigmoid(U h)))``;
    ``z = sum_n a_n h_n``; ``prediction = softmax(C z)``.

    Args:
        feature_dim: ``D``, the tile features' width.
        embedding_dim: ``E``, the slide embedding's width.
        classes: ``C``.
        hidden: Width of the attention branch.
    """

    def __init__(self, feature_dim: int, embedding_dim: int, classes: int, hidden: int = 256):
        super().__init__()
        self.feature_dim = feature_dim
        self.project = nn.Sequential(nn.Linear(feature_dim, embedding_dim), nn.ReLU())
        self.attention_v = nn.Linear(embedding_dim, hidden)
        self.attention_u = nn.Linear(embedding_dim, hidden)
        self.attention_w = nn.Linear(hidden, 1)
        self.classifier = nn.Linear(embedding_dim, classes)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.project(features)
        gate = torch.tanh(self.attention_v(h)) * torch.sigmoid(self.attention_u(h))
        attention = torch.softmax(self.attention_w(gate).squeeze(-1), dim=0)
        embedding = attention @ h
        prediction = torch.softmax(self.classifier(embedding), dim=-1)
        return prediction, attention, embedding


class MeanPool(nn.Module):
    """The mean of a slide's tile features, and the uniform attention that gives it."""

    def __init__(self, feature_dim: int):
        super().__init__()
        self.feature_dim = feature_dim

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attention = torch.ones_like(features[:, 0]) / features.shape[0]
        return attention, features.mean(dim=0)
