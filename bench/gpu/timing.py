"""The GPU check's timing stages (:mod:`bench.gpu.check` runs them).

* **tiles/s**: 64 single-tile clients over V2 binary REST, V2 gRPC and V1
  base64 JPEG, and 16 clients of 64 tiles (the slide client's shape) over V2
  binary REST, against the in-process limit (the package's forward at batch
  64 on an input already on the device). The load comes from
  ``python -m bench.load.generator`` in its own process, as in the benchmark.
* **instances**: tiles/s with 1 vs 2 instances on the first device (two
  windows each, alternating; :func:`bench.gpu.parts._instances`).
* **copy vs compute**: per batch (64; 8 on the dry run), the pinned copy and normalisation,
  the forward, and both through ``forward_batch``.
* **event loop**: the loop's progress while a worker thread runs forwards
  (torch's loader holds the GIL while it launches a forward's kernels):
  :func:`bench.stages.gil.measure`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from bench.gpu.stages import Context, servers

CELLS = (("v2-pixels", 64, 1), ("v2-grpc", 64, 1), ("v1-jpeg", 64, 1), ("v2-pixels", 16, 64))
"""(protocol, clients, tiles per request) of the tiles/s cells."""


def _timing_package(ctx: Context) -> tuple[str, Any]:
    return "vit-b-bf16", ctx.require("vit-b-bf16")


def _limit(ctx: Context, path: Any) -> dict[str, float]:
    """The package's forward alone at ``ctx.batch`` on the device: tiles/s."""
    import torch

    from predictor.runtime.loader import load_package

    batch = ctx.batch
    package = load_package(path, torch.device(ctx.first))
    x = torch.randn(batch, 3, 224, 224).to(package.device, package.input_dtype)
    sync = torch.cuda.synchronize if ctx.device == "cuda" else (lambda: None)
    with torch.inference_mode():
        for _ in range(3):
            package(x)
        sync()
        reps, start = 0, time.perf_counter()
        while time.perf_counter() - start < max(0.5, ctx.window_s / 4) or reps < 3:
            package(x)
            reps += 1
        sync()
        seconds = time.perf_counter() - start
    return {
        "batch": batch,
        "forward_ms": 1e3 * seconds / reps,
        "tiles_per_s": batch * reps / seconds,
    }


def throughput(ctx: Context) -> dict[str, Any]:
    """Tiles/s of each cell against the in-process limit."""
    name, path = _timing_package(ctx)
    out: dict[str, Any] = {"package": name, "limit": _limit(ctx, path)}
    warmup_s = 0.2 if ctx.dry_run else 2.0
    with servers(ctx, {name: path}) as running:
        server = running[name]
        jobs = [
            {
                "protocol": protocol, "concurrency": clients, "tiles": tiles, "model": name,
                "http": server.http_url, "grpc": server.grpc_url, "tile_size": 224,
                "warmup_s": warmup_s, "window_s": ctx.window_s, "drain_s": 30.0,
                "max_requests": 10**7, "timeout_s": 60.0, "server_pid": server.pid,
            }
            for protocol, clients, tiles in CELLS
        ]  # fmt: skip
        stdin = "".join(json.dumps(job) + "\n" for job in jobs)
        timeout = len(jobs) * (warmup_s + ctx.window_s + 40)
        proc = subprocess.run(
            [sys.executable, "-m", "bench.load.generator"],
            input=stdin, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    answers = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    if len(answers) != len(jobs):
        raise RuntimeError(f"loadgen answered {len(answers)} of {len(jobs)}: {proc.stderr[-500:]}")
    limit = out["limit"]["tiles_per_s"]
    for (protocol, clients, tiles), answer in zip(CELLS, answers, strict=True):
        if "failed" in answer:
            out[f"{protocol} {clients}x{tiles}"] = {"error": answer["failed"]}
            continue
        rate = answer["throughput"]
        out[f"{protocol} {clients}x{tiles}"] = {
            "tiles_per_s": rate,
            "of_limit": rate / limit if limit else None,
            "p50_ms": answer["p50_ms"],
            "p99_ms": answer["p99_ms"],
            "errors": answer["errors"],
        }
    out["ok"] = all("error" not in v and not v["errors"] for k, v in out.items() if " " in k)
    return out


def instances(ctx: Context) -> dict[str, Any]:
    """Tiles/s with 1 vs 2 instances on the first device, 8 clients of 64 tiles."""
    from bench.gpu.parts import _instances, _run

    name, path = _timing_package(ctx)
    args = argparse.Namespace(batch=ctx.batch, clients=8, seconds=ctx.window_s)
    one = _run(path, ctx.first, args)
    out = _instances(path, ctx.first, args, one)
    return {"package": name, **out}


def copy_vs_compute(ctx: Context) -> dict[str, Any]:
    """Milliseconds per batch of 64: copy+normalise, forward, and both through ``forward_batch``."""
    from bench.gpu.parts import build
    from bench.gpu.parts import copy_vs_compute as measure

    name, path = _timing_package(ctx)
    model = build(path, ctx.first, ctx.batch)
    try:
        return {"package": name, "batch": ctx.batch, **measure(model, ctx.batch)}
    finally:
        model.stop()


def event_loop(ctx: Context) -> dict[str, Any]:
    """The event loop's progress while forwards of 64 run in a worker thread (the GIL in launches)."""
    import torch

    from bench.stages.gil import measure
    from predictor.runtime.loader import load_package

    name, path = _timing_package(ctx)
    package = load_package(path, torch.device(ctx.first))
    x = torch.randn(ctx.batch, 3, 224, 224).to(package.device, package.input_dtype)
    sync = torch.cuda.synchronize if ctx.device == "cuda" else (lambda: None)

    def forward() -> None:
        with torch.inference_mode():
            package(x)
        sync()

    forward()
    launch = _launch_ms(package, x, sync)
    figures = asyncio.run(measure(forward, 4 if ctx.dry_run else 20))
    return {"package": name, "batch": ctx.batch, **figures, "launch_ms": launch}


def _launch_ms(package: Any, x: Any, sync: Any) -> float:
    """Milliseconds the calling thread spends inside one forward call (launching, GIL held)."""
    import torch

    with torch.inference_mode():
        sync()
        start = time.perf_counter()
        package(x)
        launch = time.perf_counter() - start
        sync()
    return 1e3 * launch
