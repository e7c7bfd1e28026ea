"""The GPU check's packages, exported on the machine that runs them.

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
``python -m bench.gpu.packages NAME DEVICE [DEPTH]`` exports one and prints
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

REPO = Path(__file__).resolve().parents[2]


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
        default: Exported on a GPU unless ``--packages`` names others (the dry
            run exports every package).
    """

    name: str
    spec: str
    preset: str
    dtype: str
    deadline_s: float
    threads: int
    group: int
    dry_depth: int | None = None
    default: bool = True


PLAN: tuple[Export, ...] = (
    Export("vit-b-bf16", "h0-mini", "vit-b", "bf16", 130.0, 16, 0, dry_depth=1),
    Export("tiny-fp32", "h0-mini", "tiny", "fp32", 75.0, 4, 1),
    Export("tiny-bf16", "h0-mini", "tiny", "bf16", 75.0, 4, 1),
    Export("m-optimus-bf16", "m-optimus", "tiny", "bf16", 75.0, 4, 1),
    Export("tissue-seg-bf16", "tissue-seg", "tiny", "bf16", 75.0, 4, 1),
    Export("vit-g-bf16", "h0", "vit-g", "bf16", 300.0, 16, 2, dry_depth=1, default=False),
)
"""Every package, in start order by group; at most 16 compile threads at a time.

Deadlines from the H200 (torch 2.11): ViT-B took 96-99 s with 16 threads,
the four tiny demos together more than 30 s each; ViT-g was never timed and
does not fit the 10-minute call beside ViT-B's stages, so it is exported only
when ``--packages`` names it."""


def planned_export_seconds() -> float:
    """The default exports' share of the plan: each group's longest deadline, one after another."""
    default = [e for e in PLAN if e.default]
    groups = sorted({e.group for e in default})
    return sum(max(e.deadline_s for e in default if e.group == g) for g in groups)


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
        argv = [sys.executable, "-m", "bench.gpu.packages", entry.name, device, *depth]
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


LOAD_S = 30.0
"""Each exported package's load check (a new process: torch's import and the load)."""

_LOAD = """
import sys, torch
from pathlib import Path
from predictor.pt2.loader import load_package
package = load_package(Path(sys.argv[1]), torch.device(sys.argv[2]))
print(package.forward_runner, package.input_dtype, flush=True)
"""


def load_checks(paths: dict[str, Path], device: str) -> dict[str, dict[str, Any]]:
    """Each package loaded in its own process, all at once: did it load, and if not, where it broke.

    A package that crashes its loader (a segfault in native code) would take
    the whole check with it if a stage loaded it first in process; here it
    only fails its own check, with the Python stack ``faulthandler`` prints.
    """
    env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONWARNINGS="ignore")
    procs = {}
    for name, path in paths.items():
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", _LOAD, str(path), device], cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    started = time.monotonic()
    out: dict[str, dict[str, Any]] = {}
    for name, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=max(1.0, LOAD_S - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
            out[name] = {"loads": False, "error": f"no answer in {LOAD_S:.0f} s"}
            continue
        lines = text.strip().splitlines()
        if proc.returncode == 0:
            out[name] = {"loads": True, "loaded_by": lines[-1] if lines else ""}
        else:
            out[name] = {"loads": False, "rc": proc.returncode, "tail": lines[-8:]}
    return out


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
