"""The garbage collector's settings for serving: the start-up heap frozen out of every collection.

Measured on the null model with 64 single-tile clients (``gc.callbacks``
around every collection, ``docs/performance.md``): with CPython's defaults
the server ran a full (generation 2) collection every 2-12 s, and each one
walked the whole start-up heap (torch, the package, KServe, FastAPI: over a
million objects) for about 190-210 ms on the event-loop thread. Every
request in flight waited that long, which is what made histoserve's p99
about 3x Triton's. Nothing in that heap is ever garbage: it is built once
and lives until the process exits.

:func:`apply` moves everything alive after start-up into the permanent
generation (:func:`gc.freeze`), so later collections walk only what serving
allocated since. The generation-0 threshold stays at CPython's 700: a
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
from dataclasses import dataclass

logger = logging.getLogger("histoserve")


@dataclass(frozen=True)
class GcPolicy:
    """How the collector runs while serving.

    Args:
        gen0_threshold: Allocations (net of frees) of tracked objects between
            two generation-0 collections; CPython's default is 700.
        gen1_threshold: Generation-0 collections per generation-1 collection.
        gen2_threshold: Generation-1 collections per full collection.
        freeze: Move the start-up heap into the permanent generation.
    """

    gen0_threshold: int = 700
    gen1_threshold: int = 10
    gen2_threshold: int = 10
    freeze: bool = True

    def __post_init__(self) -> None:
        for name in ("gen0_threshold", "gen1_threshold", "gen2_threshold"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GcPolicy.{name} must be a positive int, got {value!r}")


def apply(policy: GcPolicy | None = None) -> GcPolicy:
    """Applies ``policy`` (default: :class:`GcPolicy`'s defaults) to this process.

    Collects once first, so the cyclic garbage start-up left behind is freed
    rather than frozen forever. Returns the policy applied.
    """
    policy = policy or GcPolicy()
    if policy.freeze:
        gc.collect()
        gc.freeze()
    gc.set_threshold(policy.gen0_threshold, policy.gen1_threshold, policy.gen2_threshold)
    logger.info(
        "gc: %d start-up objects frozen, thresholds %s", gc.get_freeze_count(), gc.get_threshold()
    )
    return policy
