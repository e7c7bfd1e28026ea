"""histoserve: a KServe predictor for histopathology tile models in AOTInductor ``.pt2`` packages.

Each layer is a folder, by imports: ``multiprocess/`` and ``export/`` (entry),
``http/`` (the front door), ``families/``, ``model/`` (the served model),
``codecs/``, ``batching/``, ``device/``, ``pt2/`` (``.pt2`` packages), and
``kserve/`` (all of KServe) at the bottom; the client is the
separate ``histoserve`` package, of which the server uses only
``histoserve.wire``. ``docs/architecture.md`` has the layer maps and walks one
request through them.

The seed's extension API is importable from here::

    from predictor import BaseServerModel, PreparedSample, ModelRequest, ModelResponse

Each name is imported on first access (PEP 562), so importing ``predictor``
loads neither torch nor KServe; only
``BaseServerModel`` does. Importing the package does nothing else.
"""

from __future__ import annotations

import importlib
from typing import Any

from histoserve import __version__  # one version for the client and the server

_SEED_NAMES = {
    "BaseServerModel": "predictor.model.base",
    "PreparedSample": "predictor.codecs.samples",
    "ModelRequest": "predictor.codecs.samples",
    "ModelResponse": "predictor.codecs.samples",
}
__all__ = ["__version__", *_SEED_NAMES]


def __getattr__(name: str) -> Any:
    """The seed's names, imported from their modules on first access."""
    module = _SEED_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'predictor' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_SEED_NAMES])
