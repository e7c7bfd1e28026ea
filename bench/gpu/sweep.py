"""The GPU check's first figures: the bf16 matmul rate, then ViT-g and ViT-B over a batch sweep.

* ``matmul_rate``: TFLOP/s of one large bf16 matmul (8192^3 on a GPU), the
  ceiling the models' rates are read against.
* ``sweep``: for each real geometry (ViT-g first), the package alone at
  batch 32, 64, 128 and 256 (1 and 2 on the dry run) on an input already on
  the device: forward ms from CUDA events, tiles/s, TFLOP/s (from the
  geometry's FLOPs per tile, :meth:`ViTConfig.flops_per_tile`) and its share
  of the matmul rate, peak memory (the allocator's, and the device's own
  ``mem_get_info``, which also counts AOTInductor's weights), and NVML's utilisation, SM clock, power
  and memory during the window (:mod:`bench.gpu.nvml`). The batch with the
  most tiles/s is each model's ``best``, which the served stage uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bench.gpu.nvml import GpuSampler
from bench.gpu.packages import planned
from bench.gpu.stages import Context

MODELS = ("vit-g-bf16", "vit-b-bf16")
GPU_BATCHES = (32, 64, 128, 256)
DRY_BATCHES = (1, 2)


def flops_per_tile(name: str, dry_run: bool) -> float:
    """FLOPs of one tile's forward through package ``name`` (its preset, at the dry depth there)."""
    from predictor.families.embedding import PRESETS
    from predictor.spec import resolve_spec

    entry = planned(name)
    cfg = PRESETS[entry.preset]
    if dry_run and entry.dry_depth:
        cfg = replace(cfg, depth=entry.dry_depth)
    spec = resolve_spec(entry.spec)
    return cfg.flops_per_tile(spec.tile_size, spec.patch_size or 14, spec.prefix_tokens)


def timed_ms(ctx: Context, fn: Callable[[], Any], min_s: float, min_reps: int = 3) -> float:
    """Milliseconds per call of ``fn``: CUDA events around the loop on a GPU, the clock on the CPU."""
    import torch

    if ctx.device != "cuda":
        reps, start = 0, time.perf_counter()
        while reps < min_reps or time.perf_counter() - start < min_s:
            fn()
            reps += 1
        return 1e3 * (time.perf_counter() - start) / reps
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps, wall = 0, time.perf_counter()
    begin.record()
    while reps < min_reps or time.perf_counter() - wall < min_s:
        fn()
        reps += 1
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / reps


def matmul_rate(ctx: Context) -> dict[str, Any]:
    """TFLOP/s of a square bf16 matmul (8192 on a GPU, 512 on the dry run)."""
    import torch

    n = 512 if ctx.dry_run else 8192
    a = torch.randn(n, n, device=ctx.first, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=ctx.first, dtype=torch.bfloat16)
    with torch.inference_mode():
        for _ in range(3):
            a @ b
        with GpuSampler() as gpu:
            ms = timed_ms(ctx, lambda: a @ b, 0.3 if ctx.dry_run else 2.0)
    tflops = 2 * n**3 / (ms / 1e3) / 1e12
    ctx.figures["matmul_tflops"] = tflops
    return {"n": n, "ms": ms, "tflops": tflops, "gpu": gpu.summary()}


def sweep(ctx: Context) -> dict[str, Any]:
    """Each real geometry at each batch; ``ok`` when every model ran (a failed one is recorded)."""
    out: dict[str, Any] = {}
    models = ctx.asked(MODELS)
    for name in models:
        try:
            out[name] = _sweep_one(ctx, name)
        except Exception as exc:  # the other model's figures still count
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        points = [v for k, v in out[name].items() if k.startswith("batch ")]
        best = max(points, key=lambda p: p["tiles_per_s"])
        out[name]["best_batch"] = ctx.best[name] = best["batch"]
    out["ok"] = all("error" not in out[m] for m in models)
    return out


def _sweep_one(ctx: Context, name: str) -> dict[str, Any]:
    import torch

    from predictor.runtime.loader import load_package

    started = time.monotonic()
    package = load_package(ctx.require(name), torch.device(ctx.first))
    flops = flops_per_tile(name, ctx.dry_run)
    out: dict[str, Any] = {"load_s": time.monotonic() - started, "gflop_per_tile": flops / 1e9}
    for batch in DRY_BATCHES if ctx.dry_run else GPU_BATCHES:
        point = out[f"batch {batch}"] = _point(ctx, package, batch, flops)
        ctx.figures[f"{name} batch {batch} tiles_per_s"] = point["tiles_per_s"]
    return out


def _point(ctx: Context, package: Any, batch: int, flops: float) -> dict[str, Any]:
    """One batch: warm-up, then a timed window with NVML sampling."""
    import torch

    cuda = ctx.device == "cuda"
    x = torch.randn(batch, 3, 224, 224).to(package.device, package.input_dtype).contiguous()
    with torch.inference_mode():
        for _ in range(2):
            package(x)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with GpuSampler() as gpu:
            ms = timed_ms(ctx, lambda: package(x), 0.2 if ctx.dry_run else 1.5)
    tflops = flops * batch / (ms / 1e3) / 1e12
    rate = ctx.figures.get("matmul_tflops")
    return {
        "batch": batch,
        "forward_ms": ms,
        "tiles_per_s": batch / (ms / 1e3),
        "tflops": tflops,
        "of_matmul": tflops / rate if rate else None,
        "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        **device_memory(cuda),
        "gpu": gpu.summary(),
    }


def device_memory(cuda: bool) -> dict[str, float | None]:
    """The device's own view beside the allocator's: ``mem_get_info``'s used and free MiB.

    AOTInductor's weights live in plain ``cudaMalloc`` (about 2.3 GB for
    ViT-g), outside the caching allocator's counters; ``used_mib`` counts
    them, the allocator's figures do not.
    """
    import torch

    if not cuda:
        return {"used_mib": None, "free_mib": None, "reserved_mib": None}
    free, total = torch.cuda.mem_get_info()
    return {
        "used_mib": (total - free) / 2**20,
        "free_mib": free / 2**20,
        "reserved_mib": torch.cuda.memory_reserved() / 2**20,
    }
