"""The GPU check's ``defaults`` stage: the figures ``max_batch_size`` and ``max_latency_ms`` are set from.

For each real model (ViT-B, then ViT-g) one in-process model is built (the
real start-up, batcher, pipelined lanes and warm-up; no HTTP, so the
figures are the device path's), and for every ``max_batch_size`` of
:data:`BATCHES` and ``max_latency_ms`` of :data:`LATENCIES_MS` a fresh
batcher is started over it (workers warmed up at that batch) and driven
for one window by :data:`CLIENTS` closed-loop clients of :data:`TILES`
tiles each (the slide client's shape, scaled down: 256 tiles in flight,
one full batch of 256). Each cell records tiles/s, request latency p50
and p99 (queueing included), the mean batch the workers ran, and the
device's memory (``mem_get_info``, AOTInductor's weights included) beside
the caching allocator's peak. ``docs/performance.md`` says which default
each column sets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from typing import Any

from bench.gpu.parts import _items, build
from bench.gpu.stages import Context
from bench.gpu.sweep import device_memory

MODELS = ("vit-b-bf16", "vit-g-bf16")
BATCHES = (32, 64, 128, 256)
DRY_BATCHES = (1, 2)
LATENCIES_MS = (2, 10)
CLIENTS, TILES = 8, 32
DRY_CLIENTS, DRY_TILES = 2, 2
WINDOW_S = 2.0


def defaults(ctx: Context) -> dict[str, Any]:
    """Every model's grid of served points; ``ok`` when every cell ran without an error."""
    out: dict[str, Any] = {
        "clients_x_tiles": f"{DRY_CLIENTS}x{DRY_TILES}" if ctx.dry_run else f"{CLIENTS}x{TILES}"
    }
    models = ctx.asked(MODELS)
    for name in models:
        try:
            out[name] = _grid(ctx, name)
        except Exception as exc:  # the other model's cells still count
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out["ok"] = all("error" not in out[m] for m in models)
    return out


def _grid(ctx: Context, name: str) -> dict[str, Any]:
    """One model: loaded once, one batcher per cell."""
    batches = DRY_BATCHES if ctx.dry_run else BATCHES
    started = time.monotonic()
    model = build(ctx.require(name), ctx.first, max(batches))
    out: dict[str, Any] = {"load_s": time.monotonic() - started}
    try:
        for batch in batches:
            for latency in LATENCIES_MS:
                cell = asyncio.run(_cell(ctx, model, batch, latency))
                out[f"max_batch_size {batch} max_latency_ms {latency}"] = cell
    finally:
        model.stop()
    return out


async def _cell(ctx: Context, model: Any, batch: int, latency_ms: int) -> dict[str, Any]:
    """One window at (``batch``, ``latency_ms``) on a fresh batcher over ``model``'s package."""
    import torch

    side = model.device_side  # its batcher is made from its options: a fresh one at these
    options = side._options
    batching = dataclasses.replace(
        options.batching, max_batch_size=batch, max_latency_ms=latency_ms
    )
    side._options = dataclasses.replace(options, batching=batching)
    model.pipeline._batcher = None
    cuda = ctx.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    await model.start_batching()  # warms every worker up at ``batch``
    batcher = model.batcher
    clients, tiles = (DRY_CLIENTS, DRY_TILES) if ctx.dry_run else (CLIENTS, TILES)
    items = _items(tiles, model.model_spec.tile_size)
    mode = model.family.resolve_mode(None)
    latencies: list[float] = []
    window_s = 0.3 if ctx.dry_run else WINDOW_S
    end = time.monotonic() + window_s

    async def client() -> None:
        while time.monotonic() < end:
            sent = time.perf_counter()
            await asyncio.gather(*batcher.submit(items, key=mode))
            latencies.append(1e3 * (time.perf_counter() - sent))

    start = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.monotonic() - start
    await batcher.close()
    ran = sum(w.batches for w in batcher.workers)
    done = len(latencies) * tiles
    ordered = sorted(latencies)
    return {
        "tiles_per_s": done / elapsed,
        "p50_ms": statistics.median(ordered) if ordered else None,
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else None,
        "mean_batch": done / ran if ran else None,
        "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        **device_memory(cuda),
    }
