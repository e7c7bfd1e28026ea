"""``python -m bench.run --out bench/results``: the whole benchmark in one run.

For each model case of the profile: the limit (forward throughput per batch
size, in-process), three servers side by side (histoserve, histoserve with
batching off, the naive KServe model), idle latency, the end-to-end matrix,
the baseline cells and the target cells; then stage-1 costs, the slide
client, the slide reading and transport stage (:mod:`bench.stages.jpeg_transport`)
and, last, cold starts (:mod:`bench.stages.coldstart`). Writes
``results.json``, ``results.md`` and PNG plots under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.profiles import PROFILES, ModelCase, Profile


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="results folder")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--models", default="", help="comma-separated model labels (default: all)")
    parser.add_argument("--device", default=None, help="override the profile's device")
    parser.add_argument(
        "--dtype", default=None, help="override the dtype of every model but the demo one"
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--coldstart_runs",
        type=int,
        default=3,
        help="server starts per package and page-cache state in the cold-start stage "
        "(1 on the tiny profile; 0 skips the stage)",
    )
    parser.add_argument(
        "--render",
        type=Path,
        default=None,
        help="only re-render results.md and plots from this JSON",
    )
    return parser.parse_args(argv)


def select_profile(args: argparse.Namespace) -> Profile:
    """The profile with the command line's overrides applied."""
    profile = PROFILES[args.profile]
    if args.models:
        wanted = set(args.models.split(","))
        profile = replace(profile, models=tuple(m for m in profile.models if m.label in wanted))
        if not profile.models:
            raise SystemExit(f"no model labelled {sorted(wanted)} in profile {profile.name}")
    if args.device:
        profile = replace(profile, device=args.device)
    if args.dtype:
        models = tuple(
            m if m.label == "demo" else replace(m, dtype=args.dtype) for m in profile.models
        )
        profile = replace(profile, models=models)
    return profile


def log(message: str) -> None:
    """Progress on stderr with the elapsed time."""
    print(f"[bench {time.monotonic() - _T0:6.0f}s] {message}", file=sys.stderr, flush=True)


_T0 = time.monotonic()


def start_servers(
    profile: Profile, case: ModelCase, package: Path, log_dir: Path
) -> dict[str, Any]:
    """histoserve, batching off (baseline a), the naive model (b) and Triton (when installed)."""
    from bench.servers import launch
    from bench.triton import baseline

    common = {"device": profile.device, "threads": profile.threads, "log_dir": log_dir}
    serve = {
        "model": "bench",
        "max_queue_size": profile.max_queue_size,
        "workers": profile.preprocess_workers,
        "forward_runner": profile.forward_runner,
        **common,
    }
    started = {
        "histoserve": launch.start_histoserve(
            package, max_batch_size=case.max_batch_size, max_latency_ms=case.max_latency_ms, **serve
        ),
        "nobatch": launch.start_histoserve(
            package, max_batch_size=1, max_latency_ms=0.0, kind="nobatch", **serve
        ),
        "naive": launch.start_naive(package, model="bench", **common),
    }
    if baseline.wanted(profile) is None:
        started["triton"] = baseline.start_triton(
            package,
            model="bench",
            max_batch_size=case.max_batch_size,
            max_latency_ms=case.max_latency_ms,
            **common,
        )
    launch.wait_all_ready(started)
    return started


def measure_live(
    profile: Profile, case: ModelCase, runner: Any, limit: dict, servers: dict, client: Any
) -> dict[str, Any]:
    """Idle latency, the matrix, the baseline cells and the target cells, in that order."""
    from bench.matrix import cells, targets
    from bench.matrix.limit import limit_at
    from bench.triton import baseline

    tile_size = runner.package.embedded_spec.tile_size
    top = limit_at(limit, case.max_batch_size)
    idle = targets.idle_latency(runner, servers, profile.latency_pairs, tile_size)
    log(
        f"{case.label}: idle ms "
        + ", ".join(f"{k} {v['median_ms']:.1f}" for k, v in idle.items() if isinstance(v, dict))
    )
    speeds = expected_speeds(limit, top, idle)
    run = {
        "case": case,
        "tile_size": tile_size,
        "speeds": speeds,
        "windows": profile.windows,
        "deadline": _T0 + profile.cells_budget_s,
    }
    matrix = cells.run_cells(client, servers, cells.plan_matrix(profile, case), log=log, **run)
    base_cells = [
        cells.Cell(kind, "v2-pixels", c, n)
        for kind in ("nobatch", "naive")
        for c, n in case.baseline_cells
    ]
    baselines = cells.run_cells(client, servers, base_cells, log=log, **run)
    efficiency = targets.efficiency(runner, client, servers["histoserve"], profile, tile_size)
    log(f"{case.label}: efficiency {efficiency.get('efficiency')}")
    many = targets.many_clients(client, servers, profile, tile_size, speeds)
    log(f"{case.label}: many clients {many.get('throughput')}")
    baselines += [r for name in ("nobatch", "naive") for r in many["runs"][name]]
    vs_triton = baseline.measure(
        client,
        servers,
        case,
        profile,
        runner.package.path,
        tile_size=tile_size,
        speed_tps=top,
        log=log,
    )
    annotate(matrix + baselines + [efficiency["cell"], *many["runs"]["histoserve"]], limit)
    annotate(vs_triton.get("cells", []), limit)
    return {
        "idle_latency": idle,
        "cells": matrix,
        "baselines": baselines,
        "targets": {"efficiency": efficiency, "many_clients": many},
        "triton": vs_triton,
    }


def expected_speeds(limit: dict, top: float, idle: dict[str, Any]) -> dict[str, float]:
    """Expected tiles/s per server kind, to size each cell's windows."""
    from bench.matrix.limit import limit_at

    return {
        "histoserve": top,
        "nobatch": limit_at(limit, 1),  # one tile per forward
        "naive": min(top, 1000.0 / idle["naive"]["median_ms"]),
    }


def annotate(results: list[dict[str, Any]], limit: dict) -> None:
    """Adds the limit at each cell's mean batch size and the cell's fraction of it."""
    from bench.matrix.limit import limit_at

    for cell in results:
        if "throughput" in cell:
            batch = cell.get("mean_batch") or (cell["tiles"] if cell["server"] == "naive" else 1)
            cell["limit_at_batch"] = limit_at(limit, batch)
            cell["efficiency"] = cell["throughput"] / cell["limit_at_batch"]


def bench_model(profile: Profile, case: ModelCase, client: Any, log_dir: Path) -> dict[str, Any]:
    """Everything measured for one model case (see the module docstring)."""
    from bench.matrix.limit import ForwardRunner
    from bench.servers.packages import package_for, resolve_dtype

    if case.target_max_s is not None:
        profile = replace(profile, windows=replace(profile.windows, target_max_s=case.target_max_s))
    dtype = resolve_dtype(case, profile.device)
    log(f"{case.label}: package ({case.spec} {case.preset} {dtype})")
    package = package_for(case, profile.device)
    runner = ForwardRunner(package, profile.device)
    batches = sorted({*case.limit_batches, case.max_batch_size, profile.target_clients[1]})
    limit = runner.table(batches, profile.windows.limit_s)
    log(
        f"{case.label}: limit "
        + ", ".join(f"b{b} {r['tiles_per_s']:.1f}/s" for b, r in limit.items())
    )
    servers = start_servers(profile, case, package, log_dir)
    try:
        live = measure_live(profile, case, runner, limit, servers, client)
    finally:
        for server in servers.values():
            server.stop()
    return {
        "case": asdict(case),
        "dtype": dtype,
        "package": str(package),
        "package_mb": package.stat().st_size / 2**20,
        "tile_size": runner.package.embedded_spec.tile_size,
        "limit": {str(b): r for b, r in limit.items()},
        "single_tile_forward_ms": limit[1]["median_ms"] if 1 in limit else None,
        **live,
        "server_settings": server_settings(profile, case),
    }


def server_settings(profile: Profile, case: ModelCase) -> dict[str, Any]:
    """The three servers' configurations, for the results."""
    return {
        "histoserve": {
            "max_batch_size": case.max_batch_size,
            "max_latency_ms": case.max_latency_ms,
            "max_queue_size": profile.max_queue_size,
            "preprocess_workers": profile.preprocess_workers,
            "forward_runner": profile.forward_runner,
        },
        "nobatch": {"max_batch_size": 1, "max_latency_ms": 0.0},
        "naive": {"server": "stock kserve.ModelServer", "batching": "none"},
    }


def measure_cpu_workers(log: Callable[[str], None]) -> dict[str, Any]:
    """The event loop during a CPU forward, and one vs two device workers (issue 12)."""
    from bench.stages import gil, workers

    log("event loop during a forward")
    loop = gil.run(["--batch", "64", "--forwards", "4"])
    log("one vs two device workers")
    two = workers.measure()
    log(f"two workers: {two['gil_free_runner']['ratio']:.2f}x one (GIL-free runner)")
    return {"gil": loop, "workers": two}


def measure_coldstart(
    profile: Profile, runs: int, log_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Process start to ready per package (:mod:`bench.stages.coldstart`), split into its parts.

    The last stage, so nothing of the benchmark runs beside a start (and the
    big packages' page-cache traffic cannot slow another cell).
    """
    from bench.servers.packages import package_for
    from bench.stages import coldstart

    cfg = coldstart.ColdStartConfig(
        runs=runs,
        device=profile.device,
        threads=profile.threads,
        forward_runner=profile.forward_runner,
    )
    out = {}
    for case in coldstart.cases_for(profile):
        log(f"cold start: {case.label} package")
        out[case.label] = coldstart.measure_package(
            package_for(case, profile.device), cfg, log_dir, log
        )
    return out


def measure_instances(
    profile: Profile, log_dir: Path, log: Callable[[str], None]
) -> dict[str, Any] | None:
    """histoserve vs Triton with two instances each (:mod:`bench.stages.instances`), if Triton runs."""
    from bench.matrix.cells import LoadClient
    from bench.stages import instances
    from bench.triton import baseline

    if baseline.wanted(profile) is not None:
        return None
    log("two instances each: histoserve vs Triton")
    client = LoadClient()
    try:
        return instances.measure(profile, client, log_dir, log, rounds=2)
    finally:
        client.close()


def measure_defaults(profile: Profile, client: Any, log_dir: Path) -> dict[str, Any]:
    """Each server at its defaults: 1 vs 2 front ends on the null model, the demo vs Triton."""
    from bench.stages import defaults, frontends

    rounds = 1 if profile.name == "tiny" else 2
    out: dict[str, Any] = {}
    if profile.null_model:
        log("null model at the defaults: 1 vs 2 front ends, beside Triton")
        out["frontends"] = frontends.measure(profile, client, log_dir, log, rounds=rounds)
    log("demo package at each server's defaults")
    out["defaults"] = defaults.measure(profile, client, log_dir, log, rounds=rounds)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the profile and writes the results; returns the exit status."""
    args = parse_args(argv)
    if args.render is not None:
        from bench.report import output

        results = json.loads(args.render.read_text(encoding="utf-8"))
        output.write(results, args.out, plots=not args.no_plots)
        return 0
    profile = select_profile(args)
    os.environ["OMP_NUM_THREADS"] = str(profile.threads)
    import torch

    from bench.matrix.cells import LoadClient
    from bench.report import output
    from bench.stages.stage1 import measure_stage1

    torch.set_num_threads(profile.threads)
    started = time.time()
    out: Path = args.out
    log_dir = out / "logs.tmp"
    results: dict[str, Any] = {"meta": output.machine(profile), "profile": asdict(profile)}
    client = LoadClient()
    try:
        results["models"] = {
            m.label: bench_model(profile, m, client, log_dir) for m in profile.models
        }
        if profile.null_model:
            from bench.stages import null_rate

            log("null model")
            results["null_model"] = null_rate.measure(profile, client, log_dir, log)
        results.update(measure_defaults(profile, client, log_dir))
    finally:
        client.close()
    if profile.device == "cpu" and profile.name != "tiny":
        results.update(measure_cpu_workers(log))
        results["instances"] = measure_instances(profile, log_dir, log)
    log("stage 1")
    spec = profile.models[0].spec
    budget = 0.2 if profile.name == "tiny" else 1.0
    results["stage1"] = measure_stage1(
        spec, profile.stage1_tiles, profile.preprocess_workers, budget
    )
    if profile.name != "tiny":  # the slide client (issue 10): its own server and slide
        from bench.stages import embed_client

        cfg = embed_client.EmbedBench(device=profile.device, threads=profile.threads)
        results["embed_client"] = embed_client.write(embed_client.measure(cfg, log_dir, log), out)
    from bench.stages import jpeg_transport  # issue 35: readers, resizes and transports, one run

    log("slide reading: reader, resize and transport per model tile")
    stage = jpeg_transport.stage(repeats=1 if profile.name == "tiny" else 3)
    results["slide_reading"] = jpeg_transport.write(stage, out)
    runs = min(args.coldstart_runs, 1) if profile.name == "tiny" else args.coldstart_runs
    if runs > 0:
        results["coldstart"] = measure_coldstart(profile, runs, log_dir, log)
    results["meta"]["duration_s"] = time.time() - started
    results["meta"]["loadavg_end"] = output.loadavg()
    paths = output.write(results, out, plots=not args.no_plots)
    log("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
