"""The limit: the package's own ``forward`` throughput, in-process, preprocessing excluded.

The input is an already-normalised batch in the package's dtype, on the
device, made once; only the package call (plus a device sync on CUDA) is
timed. This is what no server can beat, whatever its protocol.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch


class ForwardRunner:
    """A loaded package and ready-made inputs, for timing forwards.

    Args:
        package: The ``.pt2`` path.
        device: ``cpu`` or ``cuda[:N]``.
    """

    def __init__(self, package: Path, device: str):
        from predictor.runtime.loader import load_package

        self.device = torch.device(device)
        self.package = load_package(package, self.device)
        self._inputs: dict[int, torch.Tensor] = {}

    def _input(self, batch: int) -> torch.Tensor:
        if batch not in self._inputs:
            size = self.package.embedded_spec.tile_size if self.package.embedded_spec else 224
            x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))
            self._inputs[batch] = x.to(self.device, self.package.input_dtype)
        return self._inputs[batch]

    @torch.inference_mode()
    def forward_s(self, batch: int) -> float:
        """Seconds for one forward of ``batch`` tiles (synchronised on CUDA)."""
        x = self._input(batch)
        start = time.perf_counter()
        self.package(x)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def measure(
        self, batch: int, budget_s: float, min_runs: int = 2, warmup: int = 3
    ) -> dict[str, float]:
        """Forward throughput at ``batch``: ``warmup`` calls, then runs until the budget is spent.

        The first calls of a fresh package are several times slower (lazy
        initialisation), hence the warm-up. ``tiles_per_s`` is the mean over
        the timed runs, like an end-to-end window; ``median_ms`` resists noise.
        """
        for _ in range(warmup):
            self.forward_s(batch)
        times: list[float] = []
        spent = 0.0
        while len(times) < min_runs or spent < budget_s:
            times.append(self.forward_s(batch))
            spent += times[-1]
            if len(times) >= 500:
                break
        return {
            "batch": batch,
            "runs": len(times),
            "tiles_per_s": batch * len(times) / sum(times),
            "median_ms": 1000.0 * statistics.median(times),
            "min_ms": 1000.0 * min(times),
        }

    def table(self, batches: Iterable[int], budget_s: float) -> dict[int, dict[str, float]]:
        """:meth:`measure` for every batch size."""
        return {b: self.measure(b, budget_s) for b in batches}


def limit_at(table: Mapping[Any, Mapping[str, float]], batch: float) -> float:
    """Forward tiles/s at ``batch`` (linear between measured sizes, flat beyond them)."""
    points = sorted((int(b), row["tiles_per_s"]) for b, row in table.items())
    if batch <= points[0][0]:
        return points[0][1]
    for (b0, t0), (b1, t1) in itertools.pairwise(points):
        if batch <= b1:
            return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
    return points[-1][1]
