"""The GPU check's packages, exported on the machine that runs them.

A ``.pt2`` is tied to the torch that exported it, so ``make gpu-check``
exports everything where it runs, from the project's own ViT builder
(:mod:`predictor.families.embedding`, no timm): H-optimus-0's ViT-g/14
(``vit-g``: 4 registers, SwiGLU, CLS out) and H0-mini's ViT-B/14 (``vit-b``:
4 registers, SwiGLU, CLS + patch mean), both 224 px, 1536 out, bf16, random
weights with a LayerScale that lets every block count; the tiny demo ViT in
fp32 and bf16 (the bf16 vs fp32 check) and the bf16 ``m-optimus`` and
``tissue-seg`` demos. On the dry run the two real geometries are built at
depth 1 (the same code, CPU seconds).

:data:`PLAN` is the export plan, one export at a time (on the H200 four
tiny exports at once each ran past 30 s, and kernel choices autotuned under
contention would be baked into the packages), each with a deadline from the
measured times: ViT-B first, then the tiny fp32 demo; the other demos, ViT-g
and H-optimus-0's user path (timm, ``histoserve export --timm``) only when
``--packages`` names them (they do not fit one 10-minute call beside
ViT-B's stages; ViT-g last, never timed). Past its deadline an export is
killed and recorded (``error`` and its seconds); every stage that needs it
fails as not exported, and the figures already measured stand. Each export
runs in its own process with a bounded number of compile threads, in an
inductor cache emptied before it starts (the exporter then compiles in a
fresh cache of its own inside it and proves the package in a fresh process
before writing it: :mod:`predictor.export.verify`), its log under
``$OUT/logs``, and its seconds recorded. Then :func:`load_checks` loads each
package once more, as the server will, in a fresh process of its own
(:func:`predictor.runtime.load_probe.probe_load`: the step reached, the signal or
the timeout), before any stage runs.

An export whose proof is killed by a signal while loading embedded weights
(the H200's crash) is exported once more with its weights appended to the
library and mapped (``--weights_layout mmap``,
:mod:`predictor.packages.weights_layout`), with its own deadline when the check's
time left holds it; the result records both tries, so one run says whether
the constants' upload from the library's data section is what crashes.
``python -m bench.gpu.packages NAME DEVICE [--depth N] [--weights_layout L]``
exports one and prints its path.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor.packages.weights_layout import AUTO, FLAG, MAPPED, add_flag, library_layout

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Export:
    """One package of the plan.

    Attributes:
        name: The package's name in the check (``vit-g-bf16``).
        spec: Built-in spec it is exported for.
        preset: Demo preset of :data:`predictor.families.embedding.PRESETS`.
        dtype: ``fp32`` or ``bf16``.
        deadline_s: The export is killed (a failed stage) past this.
        threads: Compile threads (``TORCHINDUCTOR_COMPILE_THREADS``, OpenMP) on a GPU machine.
        group: Exports of one group run at once; groups run in order.
        dry_depth: Depth on the CPU dry run (``None``: the preset's).
        default: Exported on a GPU unless ``--packages`` names others.
        timm: A timm architecture: exported the way a user exports real
            weights (``histoserve export --timm ARCH --weights FILE``), from
            random weights of that geometry saved by timm on the machine.
        dry: Exported on the CPU dry run (not the timm path: timm does not
            import beside the CPU torch of the development machine).
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
    timm: str | None = None
    dry: bool = True


H0_TIMM = "vit_giant_patch14_reg4_dinov2"
"""H-optimus-0's timm architecture (the README's ``histoserve export --timm`` line)."""

PLAN: tuple[Export, ...] = (
    Export("vit-b-bf16", "h0-mini", "vit-b", "bf16", 130.0, 16, 0, dry_depth=1),
    Export("tiny-fp32", "h0-mini", "tiny", "fp32", 45.0, 16, 1),
    Export("tiny-bf16", "h0-mini", "tiny", "bf16", 45.0, 16, 2, default=False),
    Export("m-optimus-bf16", "m-optimus", "tiny", "bf16", 45.0, 16, 3, default=False),
    Export("tissue-seg-bf16", "tissue-seg", "tiny", "bf16", 45.0, 16, 4, default=False),
    Export(
        "h0-timm-bf16", "h0", "timm", "bf16", 420.0, 16, 5, default=False, timm=H0_TIMM, dry=False
    ),
    Export("vit-g-bf16", "h0", "vit-g", "bf16", 420.0, 16, 6, dry_depth=1, default=False),
)
"""Every package, one export at a time (each its own group), in start order.

Deadlines from the H200 (torch 2.11): ViT-B took 96-99 s with 16 threads
(+ its fresh-process proof, about 15 s: a cold ``import torch``, CUDA start and
the load); a tiny demo alone is well under the 30 s four of them took at once,
so 45 s with its proof. ViT-g (40 blocks of width 1536 against ViT-B's 12 of
768) was never timed: 420 s, about 3.3x ViT-B's compile and a 2.2 GB proof."""


def planned_export_seconds() -> float:
    """The default exports' share of the plan: their deadlines, one after another."""
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


def export_one(
    name: str, device: str, depth: int | None = None, weights_layout: str = AUTO
) -> Path:
    """The cached package ``name`` exported for ``device`` (``cpu`` or ``cuda``)."""
    from harness.packages import demo_package

    entry = planned(name)
    if entry.timm:
        return export_timm(entry, device, weights_layout)
    opts: dict[str, Any] = {"max_batch": MAX_BATCH}
    if weights_layout != AUTO:
        opts["weights_layout"] = weights_layout
    if entry.dtype != "fp32":
        opts["dtype"] = entry.dtype
    if device != "cpu":
        opts["device"] = device
    if depth is not None:
        opts["depth"] = depth
    return demo_package(entry.spec, entry.preset, **opts)


def timm_export_argv(
    entry: Export, weights: Path, output: Path, device: str, weights_layout: str = AUTO
) -> list[str]:
    """``histoserve export``'s arguments for a timm entry: the user's command, as the README gives it."""
    assert entry.timm is not None
    argv = ["--spec", entry.spec, "--timm", entry.timm, "--weights", str(weights)]
    if weights_layout != AUTO:
        argv += [FLAG, weights_layout]
    return [
        *argv,
        "--dtype",
        entry.dtype,
        "--device",
        device,
        "--max_batch",
        str(MAX_BATCH),
        "--output",
        str(output),
    ]


def export_timm(entry: Export, device: str, weights_layout: str = AUTO) -> Path:
    """A timm entry exported as a user does, from random weights of its geometry saved by timm.

    The weights come from ``timm.create_model`` with the spec's own kwargs
    (seed 0), saved with safetensors (timm's own dependency); the package is
    then written by ``histoserve export --timm`` (:func:`predictor.export.build.main`).
    """
    import timm
    import torch
    from safetensors.torch import save_file

    from harness.packages import cache_root
    from predictor.export.build import main as export_main
    from predictor.export.sources import _timm_kwargs
    from predictor.spec import resolve_spec

    assert entry.timm is not None
    folder = cache_root() / entry.name
    folder.mkdir(parents=True, exist_ok=True)
    weights, output = folder / "random.safetensors", folder / f"{entry.spec}-{weights_layout}.pt2"
    if not weights.is_file():
        torch.manual_seed(0)
        kwargs = _timm_kwargs(str(resolve_spec(entry.spec).extra.get("timm_kwargs", "")), timm)
        model = timm.create_model(entry.timm, pretrained=False, num_classes=0, **kwargs)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    if export_main(timm_export_argv(entry, weights, output, device, weights_layout)) != 0:
        raise RuntimeError(f"histoserve export --timm {entry.timm} failed (see above)")
    return output


def _env(entry: Export, dry_run: bool, work: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.setdefault("HISTOSERVE_TRACE_S", "40")
    if not dry_run:
        threads = str(entry.threads)
        env.update(TORCHINDUCTOR_COMPILE_THREADS=threads, OMP_NUM_THREADS=threads)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor" / entry.name)
    return env


def _empty_cache(env: dict[str, str], dry_run: bool) -> None:
    """Empties the export's inductor cache folder on a GPU: nothing of an earlier run is reused."""
    if not dry_run:
        shutil.rmtree(env["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)


def export_all(
    names: list[str],
    dry_run: bool,
    work: Path,
    logs: Path,
    deadline_s: float | None = None,
    weights_layout: str = AUTO,
    time_left: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Exports ``names`` group by group (:data:`PLAN`), each in its own process, with
    ``weights_layout``; one whose proof crashed the loader while loading embedded weights
    once more with ``mmap``, when ``time_left()`` (the check's) still holds its deadline.

    Returns:
        Name to ``{"path", "seconds", "weights_layout", "built_layout"}``, or to
        ``{"error", "seconds", "weights_layout"}`` for an export that failed or
        ran past its deadline (killed); ``seconds`` counts from its group's
        start. A second try's result carries the first's under ``"first"``; a
        second try there was no time for is a ``"retry"`` note.
    """
    out: dict[str, Any] = {}
    for group in sorted({e.group for e in PLAN}):
        entries = [e for e in PLAN if e.group == group and e.name in names]
        if not entries:
            continue
        results = _export_group(entries, dry_run, work, logs, deadline_s, weights_layout)
        for entry in entries:
            first = results[entry.name]
            if not first.get("crashed_loading") or weights_layout == MAPPED:
                continue
            limit_s = _deadline_s(entry, dry_run, deadline_s)
            left_s = time_left() if time_left is not None else limit_s
            if left_s < limit_s:
                first["retry"] = (
                    f"not tried with {MAPPED}: {left_s:.0f} s left, {limit_s:.0f} needed"
                )
                continue
            again = _export_group([entry], dry_run, work, logs, deadline_s, MAPPED)
            results[entry.name] = {**again[entry.name], "first": first}
        out.update(results)
    return out


def _deadline_s(entry: Export, dry_run: bool, deadline_s: float | None) -> float:
    """One export's deadline: the dry run's, else ``--export_deadline_s`` or the plan's."""
    return DRY_DEADLINE_S if dry_run else (deadline_s or entry.deadline_s)


def _export_group(
    entries: list[Export],
    dry_run: bool,
    work: Path,
    logs: Path,
    deadline_s: float | None,
    weights_layout: str,
) -> dict[str, Any]:
    """One group's exports at once, each with its own deadline (or ``deadline_s``) from its start."""
    device = "cpu" if dry_run else "cuda"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    running: dict[str, tuple[Export, subprocess.Popen[str], Any]] = {}
    suffix = "" if weights_layout == AUTO else f"-{weights_layout}"
    for entry in entries:
        depth = ["--depth", str(entry.dry_depth)] if dry_run and entry.dry_depth else []
        log = (logs / f"export-{entry.name}{suffix}.log").open("w")
        argv = [sys.executable, "-m", "bench.gpu.packages", entry.name, device, *depth]
        argv += [FLAG, weights_layout]
        env = _env(entry, dry_run, work)
        _empty_cache(env, dry_run)
        proc = subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
        running[entry.name] = (entry, proc, log)
    out: dict[str, Any] = {}
    try:
        for name, (entry, proc, log) in running.items():
            limit_s = _deadline_s(entry, dry_run, deadline_s)
            out[name] = {
                **_finish(entry, proc, log, started, limit_s),
                "weights_layout": weights_layout,
            }
    except BaseException:  # the check's deadline (SIGALRM), ^C: no compiler outlives the check
        for _, proc, _ in running.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        raise
    return out


def _finish(
    entry: Export, proc: subprocess.Popen[str], log: Any, started: float, deadline_s: float
) -> dict[str, Any]:
    """Waits for one export until its deadline (counted from the start of all)."""
    left = max(1.0, deadline_s - (time.monotonic() - started))
    try:
        stdout, _ = proc.communicate(timeout=left)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its compile workers too
        proc.communicate()
        log.close()
        return {"error": f"export took over its {deadline_s:.0f} s", "seconds": None}
    seconds = time.monotonic() - started
    log.close()
    lines = stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return {
            "path": lines[-1],
            "seconds": seconds,
            "built_layout": library_layout(Path(lines[-1])),
        }
    text = Path(log.name).read_text(errors="replace")
    tail = text.strip().splitlines() or ["no output"]
    return {"error": tail[-1][:300], "seconds": seconds, "crashed_loading": crashed_loading(text)}


def crashed_loading(log: str) -> bool:
    """Whether an export's proof was killed by a signal while loading a package whose weights
    are embedded (the mapped layout is the other to try): not a Python error, a crash in the
    forward, or a package mapped already (a ViT-g's, over the size limit)."""
    proof = "stage load-in-fresh-process" in log and "was killed by signal" in log
    return proof and "during step 'load'" in log and "weights mapped" not in log


LOAD_S = 60.0
"""Each exported package's load check: a fresh process's cold ``import torch``, CUDA start,
the load and one batch (ViT-g packages get twice this: 2.2 GB of weights to upload)."""


def load_deadline_s(name: str) -> float:
    """The load check's deadline for package ``name``."""
    entry = next((e for e in PLAN if e.name == name), None)
    return 2 * LOAD_S if entry is not None and entry.spec == "h0" else LOAD_S


def load_checks(paths: dict[str, Path], device: str) -> dict[str, dict[str, Any]]:
    """Each package loaded as the server loads it, in a fresh process of its own, all at once.

    :func:`predictor.runtime.load_probe.probe_load` (the server's ``--load_probe``):
    a package that crashes its loader (a segfault in native code) or hangs
    fails its own check only, with the signal or the timeout and the last step
    reached (the child's ``faulthandler`` stack goes to the log); one that
    loads records its seconds and the time each step began.
    """
    from concurrent.futures import ThreadPoolExecutor

    from predictor.packages.metadata import read_metadata
    from predictor.runtime.load_probe import probe_load

    def check(name: str, path: Path) -> dict[str, Any]:
        try:
            metadata = read_metadata(path)
            report = probe_load(path, device, metadata, timeout_s=load_deadline_s(name))
        except Exception as exc:  # CheckpointError, or an unreadable file
            return {"loads": False, "error": str(exc)[:1500]}
        return {"loads": True, "load_s": report.seconds, "steps": report.summary()}

    with ThreadPoolExecutor(max(1, len(paths))) as pool:
        futures = {name: pool.submit(check, name, path) for name, path in paths.items()}
        return {name: future.result() for name, future in futures.items()}


def _traced_export(argv: list[str]) -> Path:
    """:func:`export_one`, dumping every thread's stack to stderr each ``HISTOSERVE_TRACE_S`` s.

    An export killed at its deadline then leaves in its log where it was.
    """
    import faulthandler

    every_s = float(os.environ.get("HISTOSERVE_TRACE_S", "0"))
    if every_s > 0:
        faulthandler.dump_traceback_later(every_s, repeat=True)
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.packages")
    parser.add_argument("name", choices=[e.name for e in PLAN])
    parser.add_argument("device")
    parser.add_argument("--depth", type=int, default=None)
    add_flag(parser, "histoserve export's")
    args = parser.parse_args(argv)
    started = time.monotonic()
    what = f"export {args.name} on {args.device} (weights {args.weights_layout})"
    print(f"{what}: start", file=sys.stderr, flush=True)
    path = export_one(args.name, args.device, args.depth, args.weights_layout)
    print(f"{what}: done in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return path


if __name__ == "__main__":
    print(_traced_export(sys.argv[1:]))
