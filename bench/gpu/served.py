"""The GPU check's served figures: ViT-B and ViT-g behind the real server, and the worker's overlap.

* ``served``: at ViT-B's best batch from the sweep (``max_batch_size``),
  16 clients x 64 tiles over V2 binary REST (4 x 2 on the dry run: one CPU
  forward a request, so a half-second window sees answers) against
  the package alone at that batch (the sweep's tiles/s), one instance, one
  front end: what HTTP costs on top of the device path. The grid of
  ``max_batch_size`` and ``max_latency_ms`` per model is the ``defaults``
  stage's (:mod:`bench.gpu.defaults`, in process). The window records
  tiles/s, latency, the mean batch, the server's CPU cores and NVML's
  utilisation, SM clock, power and memory, and after it the server's own
  device series (``histoserve_device_memory_bytes``, ``_utilization_ratio``,
  ``histoserve_oom_splits_total``).
* ``overlap``: in process (the real start-up and batcher, no HTTP), ViT-B's
  tiles/s with the pipelined worker (next batch's staging and copy during
  the forward: :mod:`predictor.device.pipeline`) and without, alternating.
  The CPU has no streams to pipeline on: the dry run measures both sides
  unpipelined.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.gpu.nvml import GpuSampler
from bench.gpu.stages import Context

CONFIGS = (("vit-b-bf16", 1, 1),)
"""(package, instances per device, front ends) of the served windows, in order."""


def _load(ctx: Context) -> tuple[int, int]:
    """(clients, tiles per request)."""
    return (4, 2) if ctx.dry_run else (16, 64)


def window(ctx: Context, server: Any, name: str, protocol: str = "v2-pixels") -> dict[str, Any]:
    """One loadgen window of ``protocol`` against ``server`` (in its own process), sampled by NVML."""
    clients, tiles = _load(ctx)
    job = {
        "protocol": protocol, "concurrency": clients, "tiles": tiles, "model": name,
        "http": server.http_url, "grpc": server.grpc_url, "tile_size": 224,
        "warmup_s": 0.2 if ctx.dry_run else 1.5, "window_s": ctx.window_s, "drain_s": 30.0,
        "max_requests": 10**7, "timeout_s": 60.0, "server_pid": server.pid,
    }  # fmt: skip
    with GpuSampler() as gpu:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.load.generator"], input=json.dumps(job) + "\n",
            capture_output=True, text=True, timeout=job["warmup_s"] + ctx.window_s + 60,
            check=False,
        )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"loadgen gave no answer: {proc.stderr[-500:]}")
    answer = json.loads(lines[-1])
    if "failed" in answer:
        raise RuntimeError(f"loadgen failed: {answer['failed']}")
    keep = (
        "throughput",
        "p50_ms",
        "p99_ms",
        "errors",
        "mean_batch",
        "server_cores",
        "forward_busy",
    )
    return {**{k: answer.get(k) for k in keep}, "gpu": gpu.summary()}


DEVICE_SERIES = (
    "histoserve_device_memory_bytes",
    "histoserve_device_utilization_ratio",
    "histoserve_oom_splits_total",
)


def device_series(base_url: str) -> dict[str, Any]:
    """The server's own device series after a window (``/metrics``): memory by device and
    kind, utilisation, OOM splits; ``{"error": ...}`` when they cannot be read."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in DEVICE_SERIES:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def served(ctx: Context) -> dict[str, Any]:
    """Each of :data:`CONFIGS` served at its model's best batch, against the package alone."""
    out: dict[str, Any] = {"clients_x_tiles": "x".join(map(str, _load(ctx)))}
    for name, instances, frontends in CONFIGS:
        key = f"{name} x{instances} fe{frontends}"
        try:
            out[key] = _served_one(ctx, name, instances, frontends)
        except Exception as exc:  # the next configuration still runs
            out[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    cells = [v for v in out.values() if isinstance(v, dict)]
    out["ok"] = all("error" not in v and not v["errors"] for v in cells)
    return out


def _served_one(ctx: Context, name: str, instances: int, frontends: int) -> dict[str, Any]:
    """One configuration: a server at the model's best batch, one window, against the package alone."""
    from bench.servers.launch import start_histoserve, wait_all_ready

    batch = ctx.best.get(name, ctx.batch)
    server = start_histoserve(
        ctx.require(name), model=name, device=ctx.first, max_batch_size=batch,
        max_latency_ms=2, max_queue_size=4096, workers=2 if ctx.dry_run else 8,
        threads=2 if ctx.dry_run else 4, log_dir=ctx.log_dir, instances=instances,
        frontends=frontends,
    )  # fmt: skip
    try:
        wait_all_ready({name: server})
        cell = window(ctx, server, name)
        cell["device_series"] = device_series(server.base)
    finally:
        server.stop()
    alone = ctx.figures.get(f"{name} batch {batch} tiles_per_s")
    cell.update(batch=batch, of_alone=cell["throughput"] / alone if alone else None)
    return cell


def overlap(ctx: Context) -> dict[str, Any]:
    """ViT-B's in-process tiles/s with and without the pipelined worker (two windows each)."""
    import asyncio

    from bench.gpu.parts import build, throughput

    name = "vit-b-bf16"
    path: Path = ctx.require(name)
    batch = ctx.best.get(name, ctx.batch)
    rates: dict[str, list[float]] = {"pipelined": [], "serial": []}
    lanes: dict[str, list[str]] = {}
    gpu: dict[str, Any] = {}
    window_s = max(0.5, ctx.window_s / 2)  # four windows, each after a model build
    for side in ("pipelined", "serial", "pipelined", "serial"):
        model = build(path, ctx.first, batch)
        model.device_side.workers.pipeline = side == "pipelined"
        try:
            with GpuSampler() as sampler:
                got = asyncio.run(throughput(model, batch, 4, window_s))
        finally:
            model.stop()
        rates[side].append(got["tiles_per_s"])
        lanes[side] = sorted(got["batches_per_worker"])
        gpu[side] = sampler.summary()
    mean = {k: sum(v) / len(v) for k, v in rates.items()}
    return {
        "package": name, "batch": batch, "tiles_per_s": rates, "workers": lanes,
        "ratio": mean["pipelined"] / mean["serial"], "gpu": gpu,
    }  # fmt: skip
