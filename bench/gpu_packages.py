"""The GPU check's packages, exported on the machine that runs them, and its real H&E crops.

A ``.pt2`` is tied to the torch that exported it, so ``make gpu-check``
exports everything where it runs, from the project's own ViT builder
(:mod:`predictor.pt2.demo_models`, no timm): H-optimus-0's ViT-g/14
(``vit-g``: 4 registers, SwiGLU, CLS out) and H0-mini's ViT-B/14 (``vit-b``:
4 registers, SwiGLU, CLS + patch mean), both 224 px, 1536 out, bf16, random
weights with a LayerScale that lets every block count; the tiny demo ViT in
fp32 and bf16 (the bf16 vs fp32 check) and the bf16 ``m-optimus`` and
``tissue-seg`` demos. On the dry run the two real geometries are built at
depth 1 (the same code, CPU seconds).

:data:`PLAN` is the export plan, in groups run one after another so no
two real models autotune on the GPU at once (kernel choices made under
contention would be baked into the packages): ViT-B alone, then the four
tiny demos together (correctness only), then ViT-g alone, last, because its
export was never timed: past its deadline it is killed and recorded
(``error`` and its seconds), every ViT-g cell after it fails as not
exported, and the ViT-B figures already stand (the fallback). Each export
runs in its own process with a bounded number of compile threads and a
deadline counted from its group's start, its own inductor cache on a GPU,
its log under ``$OUT/logs``, and its seconds recorded.
``python -m bench.gpu_packages NAME DEVICE [DEPTH]`` exports one and prints
its path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Export:
    """One package of the plan.

    Attributes:
        name: The package's name in the check (``vit-g-bf16``).
        spec: Built-in spec it is exported for.
        preset: Demo preset of :mod:`predictor.pt2.demo_models`.
        dtype: ``fp32`` or ``bf16``.
        deadline_s: The export is killed (a failed stage) past this.
        threads: Compile threads (``TORCHINDUCTOR_COMPILE_THREADS``, OpenMP) on a GPU machine.
        group: Exports of one group run at once; groups run in order.
        dry_depth: Depth on the CPU dry run (``None``: the preset's).
    """

    name: str
    spec: str
    preset: str
    dtype: str
    deadline_s: float
    threads: int
    group: int
    dry_depth: int | None = None


PLAN: tuple[Export, ...] = (
    Export("vit-b-bf16", "h0-mini", "vit-b", "bf16", 55.0, 16, 0, dry_depth=1),
    Export("tiny-fp32", "h0-mini", "tiny", "fp32", 30.0, 4, 1),
    Export("tiny-bf16", "h0-mini", "tiny", "bf16", 30.0, 4, 1),
    Export("m-optimus-bf16", "m-optimus", "tiny", "bf16", 30.0, 4, 1),
    Export("tissue-seg-bf16", "tissue-seg", "tiny", "bf16", 30.0, 4, 1),
    Export("vit-g-bf16", "h0", "vit-g", "bf16", 120.0, 16, 2, dry_depth=1),
)
"""Every package, in start order by group; at most 16 compile threads at a time."""


def planned_export_seconds() -> float:
    """The exports' share of the plan: each group's longest deadline, groups one after another."""
    groups = sorted({e.group for e in PLAN})
    return sum(max(e.deadline_s for e in PLAN if e.group == g) for g in groups)


MAX_BATCH = 256
"""The packages' largest batch: the sweep's."""

DRY_DEADLINE_S = 1200.0
"""Each export's deadline on the CPU dry run: there the exports share one
inductor cache (one compilation at a time) on two cores."""


def planned(name: str) -> Export:
    """The plan's entry ``name``."""
    return next(e for e in PLAN if e.name == name)


def export_one(name: str, device: str, depth: int | None = None) -> Path:
    """The cached package ``name`` exported for ``device`` (``cpu`` or ``cuda``)."""
    from harness.packages import demo_package

    entry = planned(name)
    opts: dict[str, Any] = {"max_batch": MAX_BATCH}
    if entry.dtype != "fp32":
        opts["dtype"] = entry.dtype
    if device != "cpu":
        opts["device"] = device
    if depth is not None:
        opts["depth"] = depth
    return demo_package(entry.spec, entry.preset, **opts)


def _env(entry: Export, dry_run: bool, work: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.setdefault("HISTOSERVE_TRACE_S", "40")
    if not dry_run:
        threads = str(entry.threads)
        env.update(TORCHINDUCTOR_COMPILE_THREADS=threads, OMP_NUM_THREADS=threads)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor" / entry.name)
    return env


def export_all(
    names: list[str], dry_run: bool, work: Path, logs: Path, deadline_s: float | None = None
) -> dict[str, Any]:
    """Exports ``names`` group by group (:data:`PLAN`), each in its own process.

    Returns:
        Name to ``{"path", "seconds"}``, or to ``{"error", "seconds"}`` for an
        export that failed or ran past its deadline (killed); ``seconds``
        counts from its group's start.
    """
    out: dict[str, Any] = {}
    for group in sorted({e.group for e in PLAN}):
        entries = [e for e in PLAN if e.group == group and e.name in names]
        out.update(_export_group(entries, dry_run, work, logs, deadline_s))
    return out


def _export_group(
    entries: list[Export], dry_run: bool, work: Path, logs: Path, deadline_s: float | None
) -> dict[str, Any]:
    """One group's exports at once, each with its own deadline (or ``deadline_s``) from its start."""
    device = "cpu" if dry_run else "cuda"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    running: dict[str, tuple[Export, subprocess.Popen[str], Any]] = {}
    for entry in entries:
        depth = [str(entry.dry_depth)] if dry_run and entry.dry_depth else []
        log = (logs / f"export-{entry.name}.log").open("w")
        argv = [sys.executable, "-m", "bench.gpu_packages", entry.name, device, *depth]
        proc = subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True,
            env=_env(entry, dry_run, work),
        )  # fmt: skip
        running[entry.name] = (entry, proc, log)
    out: dict[str, Any] = {}
    for name, (entry, proc, log) in running.items():
        limit_s = DRY_DEADLINE_S if dry_run else (deadline_s or entry.deadline_s)
        out[name] = _finish(entry, proc, log, started, limit_s)
    return out


def _finish(
    entry: Export, proc: subprocess.Popen[str], log: Any, started: float, deadline_s: float
) -> dict[str, Any]:
    """Waits for one export until its deadline (counted from the start of all)."""
    left = max(1.0, deadline_s - (time.monotonic() - started))
    try:
        stdout, _ = proc.communicate(timeout=left)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        log.close()
        return {"error": f"export took over its {deadline_s:.0f} s", "seconds": None}
    seconds = time.monotonic() - started
    log.close()
    lines = stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return {"path": lines[-1], "seconds": seconds}
    tail = Path(log.name).read_text(errors="replace").strip().splitlines() or ["no output"]
    return {"error": tail[-1][:300], "seconds": seconds}


def he_crops(n: int, size: int = 224) -> np.ndarray:
    """``n`` crops of real H&E (``wsidicom-data``'s 240x240 tile, Apache-2.0), ``uint8 [n, size, size, 3]``.

    The tile is mirrored into a seamless 480x480 block and cropped at
    different offsets, flips and rotations. Read from ``.gpu-wheels/he_tile.png``
    when present (a machine without ``wsidicom-data``; ``make wheelhouse``
    copies it there), else from the installed package.
    """
    from PIL import Image

    local = REPO / ".gpu-wheels" / "he_tile.png"
    if local.is_file():
        with Image.open(local) as image:
            tile = np.asarray(image.convert("RGB"))
    else:
        from harness.slides import he_tile

        tile = he_tile()
    top = np.concatenate([tile, tile[:, ::-1]], axis=1)
    block = np.concatenate([top, top[::-1]], axis=0)
    reps = -(-(size + 32) // block.shape[0])  # seamless, so it tiles for larger crops
    block = np.tile(block, (reps, reps, 1))
    rng = np.random.default_rng(0)
    crops = np.empty((n, size, size, 3), dtype=np.uint8)
    for i in range(n):
        y, x = rng.integers(0, block.shape[0] - size, 2)
        crop = np.rot90(block[y : y + size, x : x + size], k=i % 4)
        crops[i] = crop[:, ::-1] if (i // 4) % 2 else crop
    return crops


def _traced_export(argv: list[str]) -> Path:
    """:func:`export_one`, dumping every thread's stack to stderr each ``HISTOSERVE_TRACE_S`` s.

    An export killed at its deadline then leaves in its log where it was.
    """
    import faulthandler

    every_s = float(os.environ.get("HISTOSERVE_TRACE_S", "0"))
    if every_s > 0:
        faulthandler.dump_traceback_later(every_s, repeat=True)
    started = time.monotonic()
    print(f"export {argv[0]} on {argv[1]}: start", file=sys.stderr, flush=True)
    path = export_one(argv[0], argv[1], int(argv[2]) if len(argv) > 2 else None)
    print(f"export {argv[0]}: done in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return path


if __name__ == "__main__":
    print(_traced_export(sys.argv[1:]))
