"""The garbage collector's settings for serving: the start-up heap frozen out of every collection.

Measured on the null model with 64 single-tile clients (``gc.callbacks``
around every collection, ``docs/performance.md``, "The request path (null model)"): with CPython's defaults
the server ran a full (generation 2) collection every 2-12 s, and each one
walked the whole start-up heap (torch, the package, KServe, FastAPI: over a
million objects) for about 190-210 ms on the event-loop thread. Every
request in flight waited that long, which is what made histoserve's p99
about 3x Triton's. Nothing in that heap is ever garbage: it is built once
and lives until the process exits.

:func:`apply` moves everything alive after start-up into the permanent
generation (:func:`gc.freeze`), so later collections walk only what serving
allocated since. It has no knobs. The generation-0 threshold stays at CPython's 700: a
larger one (20,000) cut the collector's runs 150-fold but let reference
cycles that hold request buffers (an exception and its traceback, on every
503 under overload) pile up between collections, and the server's RSS grew
136-139 MiB in 6 s of overload (``tests/reliability/test_overload.py``)
against 18-23 MiB at 700. Called once from the CLI after the model is
loaded, never at import.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger("histoserve")


def apply() -> int:
    """Freezes the start-up heap out of every later collection; returns the objects frozen.

    Collects once first, so the cyclic garbage start-up left behind is freed
    rather than frozen forever. The thresholds stay CPython's (see above).
    """
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("gc: %d start-up objects frozen, thresholds %s", frozen, gc.get_threshold())
    return frozen
