"""``python3 -m bench.gpu.check``: the GPU path checked and measured on a lent GPU, in one command, under 9 minutes.

``python3 -m bench.gpu.check [--out DIR] [--dry_run] [--deadline_s 530] [--window_s 4] [--only STAGE ...]``

Made for a GPU machine with Python 3.12, a preinstalled CUDA torch, numpy,
pillow and grpcio, no network and no ``make``: what is missing there
(KServe and its web stack, tritonclient, a newer grpcio) comes as wheels in
``.gpu-wheels/`` (``make wheelhouse``), unpacked by the check itself
(:mod:`bench.gpu.env`). It records its budget first (:func:`budget`: every
part's seconds, the plan and its slack of at least :data:`SLACK_S`), exports
its packages there from the project's own ViT builder
(:mod:`bench.gpu.packages`: one real model at a time, ViT-g last and timed,
each export with its own compile threads and deadline), then runs the stages of
:data:`STAGES` in order, the most valuable figures first, each only if its
budget still fits the total deadline; after each it rewrites
``DIR/gpu-check.json`` and ``DIR/gpu-check.md``, so a timeout loses nothing
already measured. ``DIR`` also gets ``nvidia-smi -q``, ``pip list`` and
every export and server log (``DIR/logs``). A stage that fails is recorded
with its error and the next one runs; a missing package fails every stage
that needs it (never a fallback). Exit 0 when every stage ran and passed.

``--dry_run`` runs every stage on the CPU, the real geometries at depth 1
(the tests' package cache): ``tests/bench/test_gpu_script.py`` runs it in
``make test``, so the script a GPU machine runs is never run first there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.markdown import number
from predictor.packages.weights_layout import add_flag

ALLOC_CONF = "expandable_segments:True"
"""The CUDA allocator setting the image and the chart set (``PYTORCH_CUDA_ALLOC_CONF``)."""

TOTAL_S = 595.0
"""The device call's plan: just under its 10-minute limit, start-up of the machine aside."""
SLACK_S = 60.0
"""What the plan leaves unspent at least (:func:`planned_seconds` + this <= :data:`TOTAL_S`)."""
DEADLINE_S = 580.0
"""The check's own total deadline (``--deadline_s``): inside the plan, with a margin."""
DRY_DEADLINE_S = 1500.0
"""The dry run's: its exports share one inductor cache on two cores (cold: minutes)."""
BOOTSTRAP_S = 20.0
"""Unpacking the wheels and starting again (measured: ~10 s for 50 MiB)."""
FACTS_S = 10.0
"""The environment stage: torch's view of the GPU, ``nvidia-smi -q``, ``pip list``."""
LOADS_S = 60.0
"""The exported packages' load checks, all at once (:data:`bench.gpu.packages.LOAD_S`)."""


@dataclass(frozen=True)
class Stage:
    """One stage: its name, its function (``module:function`` in ``bench.gpu``) and its budget.

    ``needs``: packages of the plan it cannot run without; when the run did
    not ask for one (``--packages``), the stage is left out, and says so.
    """

    name: str
    target: str
    budget_s: float
    needs: tuple[str, ...] = ()


STAGES: tuple[Stage, ...] = (
    Stage("matmul_rate", "sweep:matmul_rate", 8),
    Stage("sweep", "sweep:sweep", 35),
    Stage("defaults", "defaults:defaults", 45),
    Stage("served", "served:served", 20),
    Stage("served_equals_direct", "stages:served_equals_direct", 20),
    Stage("jpeg", "jpeg:jpeg", 60),
    Stage("overlap", "served:overlap", 15),
    Stage("oom_split", "stages:oom_split", 12),
    Stage("bf16_families", "stages:bf16_families", 12, ("m-optimus-bf16", "tissue-seg-bf16")),
    Stage("bf16_vs_fp32", "stages:bf16_vs_fp32", 8, ("tiny-fp32", "tiny-bf16")),
    Stage("copy_vs_compute", "timing:copy_vs_compute", 8),
    Stage("throughput", "timing:throughput", 20),
    Stage("event_loop", "timing:event_loop", 6),
    Stage("h0_user_path", "h0:h0_user_path", 45, ("h0-timm-bf16",)),
)
"""Every stage after the export, most valuable first; a stage starts only if its budget fits."""


def default_stages() -> list[Stage]:
    """The stages a run with the plan's default packages runs (the others are left out)."""
    from bench.gpu.packages import PLAN

    default = {e.name for e in PLAN if e.default}
    return [s for s in STAGES if set(s.needs) <= default]


def planned_seconds() -> float:
    """The plan's own accounting: bootstrap, facts, the default exports' deadlines, their stages."""
    from bench.gpu.packages import planned_export_seconds

    total = BOOTSTRAP_S + FACTS_S + planned_export_seconds() + LOADS_S
    return total + sum(s.budget_s for s in default_stages())


def budget() -> dict[str, float]:
    """The plan's cells, recorded beside the results: what each part may take, and the slack."""
    from bench.gpu.packages import planned_export_seconds

    return {
        "bootstrap_s": BOOTSTRAP_S,
        "facts_s": FACTS_S,
        "exports_s": planned_export_seconds(),
        "loads_s": LOADS_S,
        **{f"{s.name}_s": s.budget_s for s in default_stages()},
        "planned_s": planned_seconds(),
        "total_s": TOTAL_S,
        "slack_s": TOTAL_S - planned_seconds(),
    }


def _function(target: str) -> Callable[[Any], dict[str, Any]]:
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(f"bench.gpu.{module}"), name)


def environment(device: str, out: Path) -> dict[str, Any]:
    """Python, torch, CUDA, the GPU and its architecture; ``nvidia-smi -q`` and ``pip list`` beside."""
    import platform

    from bench.gpu.env import machine_facts

    machine = machine_facts(out)  # first: written even where torch fails to import
    import torch

    from predictor.runtime.runners import CUDA_COPIES_PER_INSTANCE

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "cpus": os.cpu_count(),
        "loader": "torch's AOTIModelPackageLoader, called flat (predictor.runtime.runners)",
        "model_copies_per_cuda_instance": CUDA_COPIES_PER_INSTANCE,
    }
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability(0)
        facts.update(gpu=torch.cuda.get_device_name(0), sm=f"{major}{minor}")
        facts["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return {**facts, **machine}


class Report:
    """The results so far, rewritten to ``gpu-check.json`` and ``gpu-check.md`` after each stage."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.data: dict[str, Any] = {}
        out.mkdir(parents=True, exist_ok=True)

    def add(self, stage: str, result: dict[str, Any]) -> None:
        self.data[stage] = result
        (self.out / "gpu-check.json").write_text(json.dumps(self.data, indent=2, default=str))
        (self.out / "gpu-check.md").write_text("\n".join(self.table()) + "\n")
        print(f"gpu-check: {stage}: {status(result)}", file=sys.stderr, flush=True)

    def table(self) -> list[str]:
        """One row per stage: its status, seconds and a few figures."""
        lines = ["| stage | status | s | figures |", "| --- | --- | --- | --- |"]
        for stage, result in self.data.items():
            lines.append(
                f"| {stage} | {status(result)} | {number(result.get('seconds'))} | "
                f"{_figures(result)} |"
            )
        return lines


def status(result: dict[str, Any]) -> str:
    """``ok``, ``FAIL``, ``error``, ``skipped`` or ``ran`` (nothing to pass or fail)."""
    if "error" in result:
        return "error"
    if "skipped" in result:
        return "skipped"
    if "ok" not in result:
        return "ran"
    return "ok" if result["ok"] else "FAIL"


def _figures(result: dict[str, Any], limit: int = 6) -> str:
    """A few ``key=value`` pairs of a stage's result, nested one level, numbers rounded."""
    pairs: list[str] = []
    for key, value in result.items():
        if key in ("ok", "seconds"):
            continue
        if isinstance(value, dict):
            inner = ", ".join(
                f"{k}={number(v, 4)}" for k, v in value.items() if isinstance(v, (int, float))
            )
            pairs.append(f"{key}: {inner}" if inner else key)
        elif isinstance(value, (int, float, str)):
            pairs.append(f"{key}={number(value, 4)}")
    return "; ".join(pairs[:limit]).replace("|", "/")


def asked_packages(args: argparse.Namespace) -> list[str]:
    """``--packages``, else the plan's defaults on a GPU and every dry-run package on the dry run."""
    from bench.gpu.packages import PLAN

    return args.packages or [e.name for e in PLAN if (e.dry if args.dry_run else e.default)]


def _export(
    args: argparse.Namespace, report: Report, logs: Path, time_left: Callable[[], float]
) -> dict[str, Path]:
    """The export stage: the asked packages, then each loaded once in its own process.

    A failed export, or a package that does not load, is recorded and left
    out (every stage that needs it fails); never replaced by another.
    """
    from bench.gpu.packages import export_all, load_checks

    started = time.monotonic()
    exported = export_all(
        asked_packages(args),
        args.dry_run,
        args.work,
        logs,
        args.export_deadline_s,
        args.weights_layout,
        time_left,
    )
    paths = {n: Path(v["path"]) for n, v in exported.items() if "path" in v}
    loads = load_checks(paths, "cpu" if args.dry_run else "cuda:0")
    for name, check in loads.items():
        exported[name].update(check)
    report.add(
        "export",
        {
            "seconds": time.monotonic() - started,
            "ok": all(v.get("loads") for v in exported.values()),
            **exported,
        },
    )
    return {n: p for n, p in paths.items() if loads[n]["loads"]}


def run(args: argparse.Namespace) -> Report:
    """The environment, the exports, then every stage whose budget still fits the deadline."""
    from bench.gpu.env import Deadline
    from bench.gpu.packages import PLAN
    from bench.gpu.stages import Context

    deadline = Deadline(args.deadline_s)
    device = "cpu" if args.dry_run else "cuda"
    report = Report(args.out)
    logs = args.out / "logs"
    deadline.arm()
    try:
        report.add("budget", budget())
        report.add("environment", _timed(lambda _: environment(device, args.out), None))
        packages = _export(args, report, logs, deadline.left)
        window_s = args.window_s if args.window_s else (0.5 if args.dry_run else 4.0)
        ctx = Context(args.dry_run, device, args.work, window_s, packages, logs=logs)
        ctx.skipped = frozenset(e.name for e in PLAN) - set(asked_packages(args))
        for stage in STAGES:
            if args.only and stage.name not in args.only:
                continue
            missing = [n for n in stage.needs if n in ctx.skipped]
            if missing:
                report.add(stage.name, {"left out": f"needs {', '.join(missing)} (--packages)"})
                continue
            if deadline.left() < stage.budget_s:
                left = f"{deadline.left():.0f} s left of {args.deadline_s:.0f}"
                report.add(stage.name, {"skipped": f"{left}, budget {stage.budget_s:.0f} s"})
                continue
            report.add(stage.name, _timed(_function(stage.target), ctx))
    finally:
        deadline.disarm()
    return report


def _timed(stage: Callable[[Any], dict[str, Any]], ctx: Any) -> dict[str, Any]:
    start = time.monotonic()
    try:
        result = stage(ctx)
    except Exception as exc:
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return {**result, "seconds": time.monotonic() - start}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the check; 0 when every stage ran and passed."""
    parser = argparse.ArgumentParser(prog="python3 -m bench.gpu.check", description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", "bench/results-gpu"))
    )
    parser.add_argument("--dry_run", action="store_true", help="every stage on the CPU, depth 1")
    parser.add_argument(
        "--deadline_s", type=float, default=None, help=f"the whole limit ({DEADLINE_S:.0f})"
    )
    parser.add_argument("--window_s", type=float, default=0.0, help="load window (4; dry 0.5)")
    parser.add_argument("--only", nargs="*", help="run only these stages (after the export)")
    parser.add_argument("--packages", nargs="*", help="export only these packages (of the plan)")
    parser.add_argument(
        "--export_deadline_s", type=float, default=None, help="every export's deadline (the plan's)"
    )
    add_flag(
        parser,
        "every export's (histoserve export's); an export whose proof crashes the loader on "
        "embedded weights is tried once more with mmap either way",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "histoserve-gpu-check",
        help="unpacked wheels, inductor caches and (off the dry run) the exported packages",
    )
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(raw)
    if args.deadline_s is None:
        args.deadline_s = DRY_DEADLINE_S if args.dry_run else DEADLINE_S
    if not args.dry_run:
        from bench.gpu.env import bootstrap

        bootstrap(raw, args.work)  # returns only when nothing is missing
        os.environ.setdefault("HISTOSERVE_TEST_PACKAGE_CACHE", str(args.work / "packages"))
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)  # before torch is imported
    import logging

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    report = run(args)
    print("\n".join(report.table()))
    failed = [s for s, r in report.data.items() if status(r) in ("FAIL", "error", "skipped")]
    if failed:
        print(f"gpu-check: not passed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
