"""Model families: the one registry of what differs per family, found by name.

A family ``NAME`` is the module ``predictor/families/NAME.py`` (or a small
package, ``NAME/``), and the registry's :data:`FAMILIES` are these modules
(what a spec may name). The module owns all of the family: ``FAMILY``, its hooks (a
:class:`~predictor.model.family.Family`) with its declaration (its modes and
what each answers, a table of :mod:`histoserve.wire.modes` the client reads
too; its section of the spec and that section's check), its inputs and
outputs, its package checks, and its demo model:

* :mod:`~predictor.families.embedding`: ViT backbones (``h0-mini``, ``h0``,
  ``h1``), the tile family's defaults
  (:class:`~predictor.model.tiles.TileFamily`) and the demo ViT;
* :mod:`~predictor.families.multimodal`: tile + bulk RNA (``m-optimus``),
  with its gene lists (:mod:`~predictor.families.multimodal.genes`);
* :mod:`~predictor.families.segmentation`: tissue masks (``tissue-seg``);
* :mod:`~predictor.families.slide`: slide heads over tile features
  (``abmil-demo``, ``mean-pool``).

A spec is checked here, through its family (:func:`family_for`):
:mod:`predictor.spec` checks what every spec has, below this layer, and the
family its modes and its section; a spec setting another family's section
is refused. Every family is served by the one
:class:`~predictor.model.base.BaseServerModel`, which asks here for its
family (by name: :func:`predictor.model.family.registry_family`); call
sites (start-up, front ends, export, demo models, the package check) ask
here too. ``--model_class MODULE:CLASS`` names a user's subclass of
``BaseServerModel`` instead (:func:`load_model_class`), served with the
spec's family alike. The family modules are imported on first use, not at
import of this package (they import torch).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Sequence
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

from predictor.errors import SpecError, StartupError
from predictor.spec import ModelSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from predictor.model.base import BaseServerModel
    from predictor.model.family import Family

FAMILIES: tuple[str, ...] = tuple(
    sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
)
"""The families a spec may name: one module each in this package."""


@cache
def _module(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")


def family_for(spec: ModelSpec | str) -> type[Family]:
    """The hooks of ``spec``'s family (or of the family named): ``predictor.families.NAME.FAMILY``.

    A spec is checked through its family first (:func:`check_spec`).

    Raises:
        SpecError: A name that is not in :data:`FAMILIES`, or a spec its family refuses.
    """
    if isinstance(spec, str):
        return _family(spec, "no such family")
    check_spec(spec)
    return _family(spec.family, f"spec {spec.name!r}")


def _family(name: str, where: str) -> type[Family]:
    if name not in FAMILIES:
        raise SpecError(f"{where}: family {name!r} is not one of {list(FAMILIES)}")
    return _module(name).FAMILY


def check_spec(spec: ModelSpec) -> None:
    """Checks the family part of ``spec``: its modes and section, by its family's rule.

    What every spec has was checked when it was built (:class:`~predictor.spec.ModelSpec`).
    A field of another family's section (its ``SPEC_FIELDS``) must keep its
    default: a slide spec's ``classes`` on an embedding spec is a mistake, not a no-op.

    Raises:
        SpecError: One line naming the spec, the field and what it must be.
    """
    family = _family(spec.family, f"spec {spec.name!r}")
    for other in FAMILIES:
        if other == spec.family:
            continue
        for name in _module(other).FAMILY.SPEC_FIELDS:
            value = getattr(spec, name)
            if value != _default(name):
                raise SpecError(
                    f"spec {spec.name!r} ({spec.family}) sets {name} {value!r}, which only a "
                    f"{other} spec has"
                )
    family.check_spec(spec)


@cache
def _default(name: str) -> Any:
    """The default of the spec field ``name``."""
    field = next(f for f in dataclasses.fields(ModelSpec) if f.name == name)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def server_model(
    spec: ModelSpec,
    checkpoint_name: str,
    *args: Any,
    model_class: type[BaseServerModel] | None = None,
    **kwargs: Any,
) -> BaseServerModel:
    """The served model of ``spec``: ``model_class`` (``BaseServerModel``), which holds its family.

    The other arguments are ``BaseServerModel``'s.
    """
    from predictor.model.base import BaseServerModel

    cls = model_class or BaseServerModel
    return cls(spec, checkpoint_name, *args, **kwargs)


def load_model_class(target: str) -> type[BaseServerModel]:
    """The class ``target`` (``MODULE:CLASS``, the ``--model_class`` flag) names.

    The module is imported as Python finds it (installed, or on ``PYTHONPATH``).

    Raises:
        StartupError: ``target`` is not ``MODULE:CLASS``, the module cannot be
            imported (whatever it raised), it has no such attribute, or the
            attribute is not a subclass of ``BaseServerModel``.
    """
    from predictor.model.base import BaseServerModel

    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise StartupError(f"--model_class {target!r}: expected MODULE:CLASS")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may raise anything at import
        raise StartupError(
            f"--model_class {target!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    cls = getattr(module, attr, None)
    if cls is None:
        raise StartupError(f"--model_class {target!r}: module {module_name!r} has no {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, BaseServerModel)):
        raise StartupError(
            f"--model_class {target!r} is not a subclass of predictor.BaseServerModel"
        )
    return cls


def check_consistency(
    spec: ModelSpec, shapes: Sequence[Sequence[int]], *, prediction_dim: int | None = None
) -> None:
    """Checks probed per-tile output shapes against the spec, by its family's rule.

    Embedding packages return ``[D]``; multimodal ``([K], [D])``; segmentation
    ``[1, T, T]`` or ``[T, T]`` logits. ``prediction_dim`` (``K``, e.g. the
    output gene list's length) is checked when given.

    Raises:
        SpecMismatch: One line naming the spec, the expectation and the package's
            value, e.g. ``spec 'h0-mini' says embedding_dim 1536 but the package
            returns 768``.
    """
    from predictor.model.family import check_shapes

    check_shapes(family_for(spec), spec, shapes, prediction_dim)


def build_demo_model(
    spec: ModelSpec, preset: str = "tiny", *, seed: int = 0, **opts: Any
) -> nn.Module:
    """A random-weight module with ``spec``'s exact input/output geometry, in eval mode.

    The family's demo model (its ``build_demo``), under a seeded RNG so the
    same call gives the same weights.

    Args:
        spec: The spec whose family and geometry the module follows.
        preset: ``tiny`` (fast to compile), ``vit-s`` (ViT-S/14), ``vit-b``
            or ``vit-g`` (ViT-g/14, GPU benchmarks only): see
            :data:`predictor.families.embedding.PRESETS`.
        seed: Seed for the random weights, so the same call gives the same model.
        **opts: Family options: ``width``, ``depth``, ``heads``, ``mlp_ratio``,
            ``embedding_dim`` (override the spec's, e.g. to build a deliberately
            wrong package); multimodal ``genes_in``/``genes_out``;
            segmentation ``channels``, ``pad_to_batch``; slide ``hidden``.

    Raises:
        SpecError: Unknown family, preset or option.
    """
    import torch

    family = family_for(spec)
    remaining = dict(opts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = family.build_demo(spec, preset, remaining)
    if remaining:
        raise SpecError(f"unknown demo options {sorted(remaining)} for family {spec.family!r}")
    return module.eval()


def demo_example_inputs(
    spec: ModelSpec, batch: int, *, genes_in: int | None = None, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """Example inputs for ``spec``'s packages, normalised tiles first (the family's choice).

    Multimodal inputs add ``bulk_rna [B, genes_in]`` (log1p-like values; None:
    its demo's gene count) whose last row is all ``NaN`` when ``batch > 1``,
    so the "no bulk RNA" path is part of every export and probe.
    """
    return family_for(spec).example_inputs(spec, batch, genes_in=genes_in, seed=seed)
