"""``python -m bench.studies.device_path``: the CPU device path before and after issue 38, interleaved.

Issue 38 reworked the device path for the GPU (a lane gives the turn back
before the answers are built, outputs copied into pinned memory, staging
events, one fused normalisation, torch's loader called flat); on the CPU
nothing may get slower. Two versions of ``predictor/`` run the same loop
in their own processes, one thread each, on one demo package: this
checkout and the one at :data:`BEFORE` (extracted from git history by
:func:`bench.servers.before.source_tree`, same virtual environment). Timed per
version, in alternating rounds (before, after, before, ...):

* ``forward_batch``: the model's whole stage 2 for one batch of raw tiles
  (stage, normalise, the package, outputs to the host, answers), per
  ``--forward_runner`` (``gil_free``, the CPU default, and ``torch``);
* ``call``: one call of the loaded package alone (the runner's own cost:
  torch's ``AOTICompiledModel`` before, :class:`~predictor.runtime.runners.TorchRunner`
  after).

Reported: the median microseconds per call of each, per version, and the
ratio after/before. On this shared machine single figures are noise; the
ratio of interleaved rounds is what to read. A forward of the tiny demo
takes milliseconds, so a runner's own cost (tens of microseconds) drowns
in that noise: ``runner_overhead`` measures it apart, in one process, torch's
``AOTICompiledModel`` and :class:`~predictor.runtime.runners.TorchRunner`
over the same loader alternating call by call (median microseconds each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.servers.before import source_tree
from harness.packages import demo_package
from harness.server import REPO

BEFORE = "efb96c6"
"""The device path before issue 38."""

_LOOP = """
import json, sys, time
import numpy as np
import torch
from predictor.codecs.samples import PreparedSample
from predictor.device.slot import build_normalizer
from predictor.runtime.loader import load_package
from predictor.device.slot import DeviceSlot
from predictor.model.options import ServingOptions
from predictor.model.served_package import ServedPackage
from predictor.model.tiles import TileFamily
from predictor.spec import BUILTIN_SPECS
torch.set_num_threads(1)
path, runner, batch, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
spec = BUILTIN_SPECS["h0-mini"]
package = load_package(path, torch.device("cpu"), runner=runner)
hooks = TileFamily(spec, ServingOptions(), ServedPackage(package))
slot = DeviceSlot(package, build_normalizer(package, spec))
rng = np.random.default_rng(0)
samples = [PreparedSample(tile=rng.integers(0, 255, (224, 224, 3), np.uint8)) for _ in range(batch)]
x = hooks.batch_inputs(samples, slot)[0].clone()
out = {}
with torch.inference_mode():
    for name, step in (
        ("forward_batch", lambda: hooks.forward_batch(samples, [None] * batch, "embedding", slot)),
        ("call", lambda: package(x)),
    ):
        for _ in range(5):
            step()
        start = time.perf_counter()
        for _ in range(calls):
            step()
        out[name] = 1e6 * (time.perf_counter() - start) / calls
print(json.dumps(out))
"""


def _round(tree: Path, package: Path, runner: str, batch: int, calls: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _LOOP, str(package), runner, str(batch), str(calls)],
        capture_output=True, text=True, check=True, env=env, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(
    rounds: int = 3, batches: tuple[int, ...] = (1, 8), calls: int = 200
) -> dict[str, dict[str, float]]:
    """Per cell (``runner batch=B``) and version: median microseconds per call of each step."""
    trees = {"before": source_tree(BEFORE), "after": REPO}
    package = demo_package("h0-mini")
    cells: dict[str, dict[str, float]] = {}
    for runner in ("gil_free", "torch"):
        for batch in batches:
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            for _ in range(rounds):
                for name, tree in trees.items():
                    runs[name].append(_round(tree, package, runner, batch, calls))
            cell: dict[str, float] = {}
            for step in ("forward_batch", "call"):
                for name in trees:
                    cell[f"{step}_us_{name}"] = statistics.median(r[step] for r in runs[name])
                cell[f"{step}_ratio"] = cell[f"{step}_us_after"] / cell[f"{step}_us_before"]
            cells[f"{runner} batch={batch}"] = cell
    return cells


def runner_overhead(calls: int = 2000) -> dict[str, float]:
    """Median microseconds per call of torch's wrapper and :class:`TorchRunner`, call by call."""
    import time

    import torch
    from torch.export.pt2_archive._package import AOTICompiledModel

    from predictor.runtime.loader import load_package
    from predictor.runtime.runners import TorchRunner

    torch.set_num_threads(1)
    loader = load_package(
        demo_package("h0-mini"), torch.device("cpu"), runner="torch"
    ).runner.loader
    sides = {"torch_wrapper": AOTICompiledModel(loader), "flat_runner": TorchRunner(loader)}
    x = torch.zeros(1, 3, 224, 224)
    times: dict[str, list[float]] = {name: [] for name in sides}
    with torch.inference_mode():
        for i in range(calls):
            for name, call in sides.items() if i % 2 else reversed(sides.items()):
                start = time.perf_counter()
                call(x)
                times[name].append(1e6 * (time.perf_counter() - start))
    out = {f"{name}_us": statistics.median(t) for name, t in times.items()}
    out["saved_us"] = out["torch_wrapper_us"] - out["flat_runner_us"]
    return out


def main(argv: list[str] | None = None) -> int:
    """Prints every cell's figures and ratios as JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.device_path", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--overhead_calls", type=int, default=2000)
    args = parser.parse_args(argv)
    figures = {"runner_overhead": runner_overhead(args.overhead_calls)}
    figures.update(measure(args.rounds, tuple(args.batches), args.calls))
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
