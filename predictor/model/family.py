"""What a model family is to the server: :class:`Family`, a small named set of hooks.

The served model (:class:`~predictor.model.base.BaseServerModel`) is one
class for every family; what differs per family is a part it holds, an
instance of a :class:`Family` subclass (in the spirit of LitServe's
``LitAPI``). The hooks, by stage:

* declaration (class-level, what the registry checks a spec against):
  ``MODE_OUTPUTS`` (its modes and what each answers: the client's table in
  :mod:`histoserve.wire.modes`, referenced, never copied), ``SPEC_FIELDS``
  (its section of the spec) and :meth:`~Family.check_spec`;
* package (class-level, no server needed: export, demo models, the start-up
  check): ``PACKAGE_INPUTS``, :meth:`~Family.package_outputs`,
  :meth:`~Family.recorded_shape`, :meth:`~Family.check_outputs`,
  :meth:`~Family.build_demo`, :meth:`~Family.example_inputs`,
  ``DEFAULT_MAX_BATCH``, ``CROSSES_PROCESSES`` and
  :meth:`~Family.serving_options` (a family's own batching limits);
* start-up: :meth:`~Family.load_assets`, :meth:`~Family.check_package`
  (the first device's package), :meth:`~Family.bind_device` (every
  device's), :meth:`~Family.warm_up`, :meth:`~Family.warm_worker`;
* decode: :meth:`~Family.v2_codec`, :meth:`~Family.resolve_mode`,
  :meth:`~Family.mode_for_outputs`;
* prepare (stage 1, per item in the decode pool): :meth:`~Family.prepare_sample`;
* forward (stage 2, per batch on a device worker): :meth:`~Family.forward_batch`;
* outputs: :meth:`~Family.outputs` (each output's name, datatype and
  shape, for a mode or all), :meth:`~Family.input_types`,
  :meth:`~Family.metadata`.

Per-tile families share the tile hooks of :class:`~predictor.model.tiles.TileFamily`
(the embedding backbone's defaults); the slide family implements these
hooks itself and has none of the tile ones. A family reaches what the model
was given through its parts: the spec, the options, the served package
(:class:`~predictor.model.served_package.ServedPackage`) and the device
slot it is handed per batch, and the seed's hooks it names (``SEED_HOOKS``)
bound to the model, so that a model class overriding one is obeyed; it never
sees KServe.

Every family is found by name in the registry (:mod:`predictor.families`),
the model included (:func:`registry_family`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from predictor.codecs.base import Codec
from predictor.codecs.samples import ModelRequest, ModelResponse, PreparedSample
from predictor.device.faults import FaultHook
from predictor.device.slot import DeviceSlot
from predictor.errors import InvalidInput, SpecError, SpecMismatch
from predictor.model.options import ServingOptions
from predictor.model.served_package import ServedPackage
from predictor.runtime.loader import LoadedPackage
from predictor.runtime.probe import format_shapes
from predictor.spec import ModelSpec

REGISTRY = "predictor.families"
"""The family registry's package: a family ``NAME`` is its module ``NAME``."""


@dataclass(frozen=True)
class OutputSpec:
    """One output tensor as the V2 metadata describes it: ``-1`` for the batch axis."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def as_v2(self) -> dict[str, Any]:
        """The V2 metadata entry (``name``, ``datatype``, ``shape`` as a list)."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


class Family:
    """The hooks every family has; a subclass implements the ones that raise here.

    Args:
        spec: The model specification.
        options: The serving options (after :meth:`serving_options`).
        served: The served package's facts, set as the model loads.
        fault_hook: Test-only forward fault injection; ``None`` in production.
        seed_hooks: The served model's overrides of the seed hooks named in
            ``SEED_HOOKS``, bound to it, so a model class's override is what
            runs; a hook not given is the family's own.
    """

    MODE_OUTPUTS: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    """The modes a spec of this family may list, each to the outputs it answers
    (a table of :mod:`histoserve.wire.modes`, which the client checks answers against)."""
    SPEC_FIELDS: ClassVar[tuple[str, ...]] = ()
    """The spec fields that are this family's section: no other family's spec may set them."""
    SEED_HOOKS: ClassVar[tuple[str, ...]] = ()
    """Names of the served model's seed hooks this family calls (``preprocess_bulk_rna``)."""

    PACKAGE_INPUTS: ClassVar[tuple[str, ...]] = ()
    """Input names recorded in the family's packages, in the package's order."""
    PACKAGE_OUTPUTS: ClassVar[tuple[str, ...]] = ()
    """Output names recorded in the family's packages, primary first."""
    CROSSES_PROCESSES: ClassVar[bool] = False
    """Whether ``--frontends > 1`` can serve it: its items fit fixed-size shared-memory slots."""
    DEFAULT_MAX_BATCH: ClassVar[int] = 256
    """``histoserve export``'s default upper bound of the packages' dynamic axis."""

    def __init__(
        self,
        spec: ModelSpec,
        options: ServingOptions,
        served: ServedPackage,
        fault_hook: FaultHook | None = None,
        seed_hooks: Mapping[str, Callable[..., Any]] | None = None,
    ) -> None:
        self.spec = spec
        self.options = options
        self.served = served
        self.fault_hook = fault_hook
        self.seed_hooks: Mapping[str, Callable[..., Any]] = dict(seed_hooks or {})

    # -- declaration (class-level) ----------------------------------------------------
    @classmethod
    def check_spec(cls, spec: ModelSpec) -> None:
        """Checks ``spec``'s modes and this family's section of it (the registry calls it).

        A subclass checks its ``SPEC_FIELDS`` and calls ``super()``.

        Raises:
            SpecError: One line naming the spec, the field and what it must be.
        """
        allowed = tuple(cls.MODE_OUTPUTS)
        if any(mode not in cls.MODE_OUTPUTS for mode in spec.modes):
            raise SpecError(
                f"spec {spec.name!r} ({spec.family}): modes {list(spec.modes)} must be drawn "
                f"from {list(allowed)}"
            )

    # -- package (class-level) --------------------------------------------------------
    @classmethod
    def package_outputs(cls, spec: ModelSpec) -> tuple[str, ...]:
        """Output names ``spec``'s packages record, primary first (default: ``PACKAGE_OUTPUTS``)."""
        return cls.PACKAGE_OUTPUTS

    @classmethod
    def recorded_shape(cls, name: str, shape: Sequence[int]) -> list[int]:
        """How package metadata records a tensor's shape: ``-1`` for the batch axis."""
        return [-1, *shape[1:]]

    @classmethod
    def check_outputs(
        cls, spec: ModelSpec, shapes: Sequence[tuple[int, ...]], prediction_dim: int | None
    ) -> None:
        """Checks the probed per-item output shapes against ``spec``.

        Raises:
            SpecMismatch: One line naming the spec, the expectation and the package's value.
        """
        raise NotImplementedError(f"{cls.__name__} does not say what its outputs must be")

    @classmethod
    def build_demo(cls, spec: ModelSpec, preset: str, opts: dict[str, Any]) -> nn.Module:
        """The random-weight demo module; pops the options it uses from ``opts``."""
        raise NotImplementedError(f"{cls.__name__} has no demo module")

    @classmethod
    def example_inputs(
        cls, spec: ModelSpec, batch: int, *, genes_in: int | None, seed: int
    ) -> tuple[torch.Tensor, ...]:
        """Example package inputs for export and tests, in ``PACKAGE_INPUTS`` order.

        ``genes_in`` sizes a per-tile gene vector where the family takes one
        (None: its demo's); the others ignore it.
        """
        raise NotImplementedError(f"{cls.__name__} has no example inputs")

    @classmethod
    def serving_options(
        cls, options: ServingOptions, package: LoadedPackage | None
    ) -> ServingOptions:
        """The options this family serves with (default: as given)."""
        return options

    # -- start-up ---------------------------------------------------------------------
    def load_assets(self, root: Path) -> None:
        """Reads what stage 1 and the description need from beside the package (nothing by default).

        Called before the package is checked, and by a front end
        (``--frontends``), which never loads the package.
        """

    def check_package(self, package: LoadedPackage) -> list[tuple[int, ...]]:
        """Checks the first device's package against the spec (default: :meth:`bind_device`).

        Returns:
            The probed per-item output shapes, primary first.

        Raises:
            SpecMismatch: The package disagrees with the spec.
        """
        return self.bind_device(package)

    def bind_device(self, package: LoadedPackage) -> list[tuple[int, ...]]:
        """Probes one device's package and checks its outputs (once per loaded package).

        Raises:
            SpecMismatch: The package disagrees with the spec.
        """
        raise NotImplementedError

    def warm_up(self, package: LoadedPackage) -> None:
        """Runs once after the checks, before the first request (the ``warmup`` phase; nothing by default)."""

    def warm_worker(self, slot: DeviceSlot, batch: int) -> None:
        """One forward with a device worker's slot before the first request."""
        raise NotImplementedError

    # -- decode -----------------------------------------------------------------------
    def v2_codec(self, model_name: str) -> Codec:
        """The V2 codec (REST and gRPC) of this family's requests."""
        raise NotImplementedError

    def resolve_mode(self, mode: str | None) -> str:
        """The request's mode, or the spec's default when it names none.

        Raises:
            InvalidInput: A mode the model does not support (``parameters.mode``).
        """
        spec = self.spec
        if mode is None:
            return spec.default_mode
        if mode not in spec.modes:
            name = self.options.name or spec.name
            raise InvalidInput(
                f"unknown mode {mode!r}; model {name!r} supports {list(spec.modes)}",
                input_name="parameters.mode",
            )
        return mode

    def mode_for_outputs(self, names: Sequence[str]) -> str:
        """The mode giving every output in ``names`` with the fewest others (spec order on ties).

        Raises:
            InvalidInput: No mode gives them all (the message lists what each mode gives).
        """
        gives = {m: [o.name for o in self.outputs(m)] for m in self.spec.modes}
        fits = [m for m, outputs in gives.items() if set(names) <= set(outputs)]
        if not fits:
            raise InvalidInput(
                f"outputs {list(names)} not produced by any mode of this model; "
                f"the modes give {gives}"
            )
        return min(fits, key=lambda m: len(gives[m]))

    # -- prepare and forward ----------------------------------------------------------
    def prepare_sample(self, request: ModelRequest) -> PreparedSample:
        """Stage 1 for one item, in the decode pool; an ``InvalidInput`` is a 400 for its request."""
        raise NotImplementedError

    def forward_batch(
        self,
        samples: list[PreparedSample],
        requests: list[ModelRequest],
        mode: str,
        slot: DeviceSlot,
    ) -> list[ModelResponse]:
        """Stage 2 for one batch on ``slot`` (a worker's package, normaliser, stream).

        One response (or an exception failing that item alone) per sample,
        aligned; anything raised fails the whole batch.
        """
        raise NotImplementedError

    # -- outputs ----------------------------------------------------------------------
    def outputs(self, mode: str | None = None) -> tuple[OutputSpec, ...]:
        """The outputs a mode returns, primary first; every output the model can return for ``None``."""
        raise NotImplementedError

    def input_types(self) -> list[dict[str, Any]]:
        """V2 metadata of the inputs a request may carry."""
        raise NotImplementedError

    def metadata(self) -> Mapping[str, Any]:
        """The family's own keys of the model's metadata (none by default)."""
        return {}


def registry_family(spec: ModelSpec) -> type[Family]:
    """``spec``'s family from the registry (:func:`predictor.families.family_for`, which
    checks the spec's family section through it).

    Found by name when called, as the registry finds its families: the family
    modules subclass :class:`Family`, so their layer sits above this one and
    no module here imports them.

    Raises:
        SpecError: The spec names no family of the registry, or fails its family's check.
    """
    return importlib.import_module(REGISTRY).family_for(spec)


def check_shapes(
    family: type[Family],
    spec: ModelSpec,
    shapes: Sequence[Sequence[int]],
    prediction_dim: int | None = None,
) -> None:
    """Checks probed per-item output shapes: their count, then the family's own rule.

    Raises:
        SpecMismatch: One line naming the spec, the expectation and the package's value.
    """
    expected = len(family.package_outputs(spec))
    if len(shapes) != expected:
        raise SpecMismatch(
            f"spec {spec.name!r} ({spec.family}) expects {expected} output(s) but the package "
            f"returns {len(shapes)}: {format_shapes(shapes)}"
        )
    family.check_outputs(spec, [tuple(s) for s in shapes], prediction_dim)


def request_mode(family: Family, mode: str | None, requested: Sequence[str] | None) -> str:
    """A request's mode: as given, else the one its named outputs imply, else the default.

    The V2 convention: a request that names outputs need not name a mode;
    one that names both must name outputs the mode gives.

    Raises:
        InvalidInput: An unknown mode, outputs no mode gives, or a mode and
            named outputs that conflict (naming both).
    """
    if not requested:
        return family.resolve_mode(mode)
    if mode is None:
        return family.mode_for_outputs(requested)
    resolved = family.resolve_mode(mode)
    gives = [o.name for o in family.outputs(resolved)]
    others = [name for name in requested if name not in gives]
    if others:
        raise InvalidInput(
            f"mode {mode!r} gives outputs {gives} but the request names outputs "
            f"{list(requested)}: name only outputs the mode gives, or leave the mode out "
            "(the named outputs then decide it)",
            input_name="parameters.mode",
        )
    return resolved
