"""histoserve: a KServe predictor for histopathology tile models in AOTInductor ``.pt2`` packages.

Each layer is a folder (``server/``, ``serving/``, ``families/``, ``codecs/``,
``batching/``, ``device/``, ``package/``, ``export/``) and the client side is
``client/``; ``docs/architecture.md`` has the one layer map and walks one
request through them.

The seed's extension API is importable from here::

    from predictor import BaseServerModel, PreparedSample, ModelRequest, ModelResponse

Each name is imported on first access (PEP 562), so importing ``predictor``
(or ``predictor.client``) loads neither torch nor KServe; only
``BaseServerModel`` does. Importing the package does nothing else.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SEED_NAMES = {
    "BaseServerModel": "predictor.serving.model",
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
