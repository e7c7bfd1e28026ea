"""Test-only forward fault injection (off by default).

Enabled only by the hidden ``--fault_injection`` flag, which the chart never
sets. Specs:

- ``nth:K[,K...]``: fail the K-th batch (1-based) of the process.
- ``every:N``: fail every N-th batch.
- ``rate:P[:SEED]``: fail each batch with probability P.
- ``marker:V``: fail any batch holding a tile whose pixels are all V
  (lets a test aim a fault at the batch its own request lands in).
- ``fatal:K``: the K-th batch raises a sticky device error (liveness test).

The hook raises :class:`~predictor.errors.ForwardError` (or a fatal error)
from inside the forward, exactly where a real device failure would surface.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from predictor.errors import ConfigError, ForwardError

FATAL_MESSAGE = "CUDA error: an illegal memory access was encountered (injected)"


@dataclass
class FaultHook:
    """Decides, batch by batch, whether to inject a failure."""

    kind: str
    numbers: tuple[int, ...] = ()
    rate: float = 0.0
    marker: int = 0
    seed: int = 0
    _count: int = 0
    _rng: random.Random = field(default_factory=random.Random)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng.seed(self.seed)

    def check(self, tiles: Sequence[np.ndarray]) -> None:
        """Raises when this batch is chosen to fail; called once per forward."""
        with self._lock:
            self._count += 1
            count = self._count
            draw = self._rng.random()
        if self.kind == "fatal" and count in self.numbers:
            raise RuntimeError(FATAL_MESSAGE)
        hit = (
            (self.kind == "nth" and count in self.numbers)
            or (self.kind == "every" and count % self.numbers[0] == 0)
            or (self.kind == "rate" and draw < self.rate)
            or (self.kind == "marker" and any(_all_equal(t, self.marker) for t in tiles))
        )
        if hit:
            raise ForwardError(
                f"injected forward failure in batch {count} (fault hook {self.kind})"
            )


def _all_equal(tile: np.ndarray, value: int) -> bool:
    return bool(tile.flatten()[0] == value) and bool((tile == value).all())


def parse_fault_spec(spec: str) -> FaultHook:
    """Builds a :class:`FaultHook` from its flag value; ConfigError names the bad spec."""
    kind, _, rest = spec.partition(":")
    try:
        if kind in ("nth", "fatal"):
            return FaultHook(kind, numbers=tuple(int(v) for v in rest.split(",")))
        if kind == "every":
            every = int(rest)
            if every < 1:
                raise ValueError(every)
            return FaultHook(kind, numbers=(every,))
        if kind == "rate":
            rate, _, seed = rest.partition(":")
            return FaultHook(kind, rate=float(rate), seed=int(seed or 0))
        if kind == "marker":
            return FaultHook(kind, marker=int(rest))
    except ValueError as exc:
        raise ConfigError(f"bad --fault_injection value {spec!r}: {exc}") from exc
    raise ConfigError(f"bad --fault_injection value {spec!r}: unknown kind {kind!r}")
