"""histoserve, the client: whole slides and cohorts to tile features, slide predictions and heatmaps.

``pip install histoserve`` installs this package (numpy, pillow and httpx;
never torch or kserve). The server is the separate ``predictor`` package of
the same distribution (``pip install 'histoserve[server]'``); nothing here
imports it, and ``histoserve serve`` / ``histoserve export`` reach it by name
only when run (:mod:`histoserve.commands.main`).

In a notebook::

    import histoserve

    summary = histoserve.embed(["slide.svs"], url="http://localhost:8080", out="features")
    slide = histoserve.read_features("features/slide.h5")    # .features, .coords, .attrs
    client = histoserve.HistoserveClient("http://localhost:8080", "h0-mini")

The rooms, bottom to top (``docs/architecture.md`` has the layer table and
its test keeps imports pointing down): ``wire/`` (the V2 binary format), the
root modules (errors, limits, terminal-safe text, atomic files), ``slides/``
(slides in), ``tissue/``, ``remote/`` (talking to servers), ``results/``
(files out, resume), ``heads/`` (slide heads), ``review/`` (what a person
checks), ``embedding/`` (one ``embed`` run), then :mod:`histoserve.api` and
``commands/`` (the console script).

Each name below is imported on first access (PEP 562): importing
``histoserve`` imports nothing else.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_WHERE = {
    "HistoserveClient": "histoserve.remote.client",
    "HistoserveError": "histoserve.errors",
    "RemoteError": "histoserve.errors",
    "RequestFailed": "histoserve.errors",
    "InferenceError": "histoserve.errors",
    "embed": "histoserve.api",
    "read_features": "histoserve.api",
    "EmbedConfig": "histoserve.embedding.config",
    "EmbedSummary": "histoserve.embedding.pipeline",
    "SlideFeatures": "histoserve.results.sources",
    "EmbedError": "histoserve.errors",
    "SlideError": "histoserve.errors",
    "UsageError": "histoserve.errors",
}
__all__ = ["__version__", *_WHERE]


def __getattr__(name: str) -> Any:
    """The public names, imported from their modules on first access."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'histoserve' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
