"""Model families: which ``BaseServerModel`` subclass serves a spec.

A registry keyed by ``ModelSpec.family``; call sites ask
:func:`model_class_for` and never branch on the family themselves. Embedding
backbones use :class:`~predictor.model.BaseServerModel` as is.
"""

from __future__ import annotations

from collections.abc import Callable

from predictor.errors import SpecError
from predictor.model import BaseServerModel
from predictor.spec import ModelSpec

_REGISTRY: dict[str, type[BaseServerModel]] = {"embedding": BaseServerModel}


def register_family(family: str) -> Callable[[type[BaseServerModel]], type[BaseServerModel]]:
    """Class decorator: serve specs of ``family`` with the decorated class."""

    def decorate(cls: type[BaseServerModel]) -> type[BaseServerModel]:
        _REGISTRY[family] = cls
        return cls

    return decorate


def model_class_for(spec: ModelSpec) -> type[BaseServerModel]:
    """The server model class for ``spec``'s family."""
    _load_builtin_families()
    try:
        return _REGISTRY[spec.family]
    except KeyError as exc:
        raise SpecError(f"no server model registered for family {spec.family!r}") from exc


def _load_builtin_families() -> None:
    # Imported on first use, not at package import: registering is a side effect.
    from predictor.families import multimodal, segmentation  # noqa: F401
