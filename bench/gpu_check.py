"""``make gpu-check``: the GPU path checked and measured on a lent GPU, in one command, under 8 minutes.

``python -m bench.gpu_check --out DIR [--dry_run] [--budget_s 450] [--window_s 6] [--vit_g]``

Made for a GPU machine with Python 3.12, a preinstalled CUDA torch, timm,
numpy, pillow and grpcio, no network: what is missing there (KServe and its
web stack, tritonclient for the gRPC load) comes as wheels in
``.gpu-wheels/`` (``make wheelhouse``; see ``bench/README.md``). It exports
its packages there (:mod:`bench.gpu_packages`: a ``.pt2`` is tied to the
torch that exported it), then runs the stages below in order and, after
each, rewrites ``DIR/gpu-check.json`` and ``DIR/gpu-check.md``, so a timeout
loses nothing already measured. A stage that fails is recorded with its
error and the next one runs; a stage is skipped once the time budget is
spent. Exit 0 when every stage ran and passed.

Correctness (:mod:`bench.gpu_stages`): served == direct (fp32 within 1e-4,
bf16 bit-equal), bf16 vs fp32 cosine on real H&E crops, bf16 multimodal
(every mode) and tissue-seg, a forced OOM split and answered. Timings
(:mod:`bench.gpu_timing`): tiles/s for 64 single-tile clients (binary REST,
gRPC, V1 base64 JPEG) and 16 x 64 tiles against the in-process limit, 1 vs 2
instances, copy vs compute, and the event loop's progress during a forward.

``--dry_run`` runs every stage on the CPU with the tiny packages (the tests'
cache), in one to two minutes here: ``tests/bench/test_gpu_script.py`` runs it in
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
from pathlib import Path
from typing import Any

from bench.markdown import number

ALLOC_CONF = "expandable_segments:True"
"""The CUDA allocator setting the image and the chart set (``PYTORCH_CUDA_ALLOC_CONF``)."""


def _stages() -> list[tuple[str, Callable[[Any], dict[str, Any]]]]:
    from bench import gpu_stages, gpu_timing

    return [
        ("served_equals_direct", gpu_stages.served_equals_direct),
        ("bf16_vs_fp32", gpu_stages.bf16_vs_fp32),
        ("bf16_families", gpu_stages.bf16_families),
        ("oom_split", gpu_stages.oom_split),
        ("throughput", gpu_timing.throughput),
        ("instances", gpu_timing.instances),
        ("copy_vs_compute", gpu_timing.copy_vs_compute),
        ("event_loop", gpu_timing.event_loop),
    ]


def environment(device: str) -> dict[str, Any]:
    """Python, torch, CUDA, the GPU and its architecture."""
    import platform

    import torch

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability(0)
        out.update(gpu=torch.cuda.get_device_name(0), sm=f"{major}{minor}")
        out["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return out


def _wanted_packages(device: str, vit_g: bool) -> list[str]:
    from bench.gpu_packages import PACKAGES

    names = ["tiny-fp32", "tiny-bf16", "m-optimus-bf16", "tissue-seg-bf16"]
    if device == "cuda" and _has_timm():
        names += ["h0-mini-fp32", "h0-mini-bf16"]
    if device == "cuda" and vit_g:
        names.append("vit-g-bf16")
    return [n for n in names if n in PACKAGES]


def _has_timm() -> bool:
    import importlib.util

    return importlib.util.find_spec("timm") is not None


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


def run(args: argparse.Namespace) -> Report:
    """Exports the packages, then every stage in order within the budget."""
    from bench.gpu_packages import export_all
    from bench.gpu_stages import Context

    started = time.monotonic()
    device = "cpu" if args.dry_run else "cuda"
    report = Report(args.out)
    report.add("environment", environment(device))
    work = args.work
    exported = export_all(_wanted_packages(device, args.vit_g), device, timeout_s=args.budget_s / 2)
    packages = {n: p for n, p in exported.items() if isinstance(p, Path)}
    report.add(
        "export",
        {
            "seconds": time.monotonic() - started,
            "ok": len(packages) == len(exported),
            **{n: str(p) if isinstance(p, Path) else p for n, p in exported.items()},
        },
    )
    window_s = args.window_s if args.window_s else (0.5 if args.dry_run else 6.0)
    ctx = Context(args.dry_run, device, work, window_s, packages)
    for name, stage in _stages():
        if args.only and name not in args.only:
            continue
        if time.monotonic() - started > args.budget_s:
            report.add(name, {"skipped": f"the {args.budget_s:.0f} s budget is spent"})
            continue
        report.add(name, _timed(stage, ctx))
        print(f"gpu-check: {name}: {status(report.data[name])}", file=sys.stderr, flush=True)
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
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench/results-gpu"))
    parser.add_argument(
        "--dry_run", action="store_true", help="every stage on the CPU, tiny packages"
    )
    parser.add_argument("--budget_s", type=float, default=450.0, help="stop starting stages after")
    parser.add_argument(
        "--window_s", type=float, default=0.0, help="load window (default 6, dry 0.5)"
    )
    parser.add_argument("--vit_g", action="store_true", help="also export the ViT-g/14 geometry")
    parser.add_argument("--only", nargs="*", help="run only these stages")
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "histoserve-gpu-check",
        help="server logs and (off the dry run) the exported packages; kept out of --out",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)  # before torch is imported
    if not args.dry_run:
        os.environ.setdefault("HISTOSERVE_TEST_PACKAGE_CACHE", str(args.work / "packages"))
    report = run(args)
    print("\n".join(report.table()))
    failed = [s for s, r in report.data.items() if status(r) in ("FAIL", "error", "skipped")]
    if failed:
        print(f"gpu-check: not passed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
