"""Issue 12's GPU-only parts, in process: every GPU used, and a batch's copy vs compute.

``python -m bench.gpu_parts [--device auto] [--seconds 15] [--batch 64] [--clients 8]``

Run by ``bash bench/gpu.sh parts`` on a CUDA node (a few minutes; the demo
package's CUDA export is cached). Two measurements through the real
start-up (:func:`predictor.startup.build_model`: one package, normaliser and
worker per GPU) and the real batcher, no HTTP:

* **Every GPU used.** Tiles per second with ``--device cuda:0`` (one worker)
  and with ``--device auto`` (one worker per visible GPU, one queue), and how
  many batches each worker ran: on an N-GPU node every worker should have
  run, and the ratio should approach N while the host keeps up.
* **Copy vs compute.** On the first device, per batch: the pinned
  host-to-device copy and normalisation alone, the package's forward alone
  (input already on the device), and ``forward_batch`` end to end. ``overlap``
  is the share of the copy hidden behind compute (0: fully serial).

More than one instance per device is refused on CUDA for now (the server
says so at start-up); this script records that refusal rather than guessing.
``--device cpu`` runs the same code on the CPU (the tests' dry run).
Prints one line per measurement and a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def build(package: Path, device: str, batch: int, instances: int = 1) -> Any:
    """The real model as start-up builds it, with a private metrics registry.

    Each configuration builds a model in this one process; KServe's global
    registry would refuse the second set of collectors.
    """
    from prometheus_client import CollectorRegistry

    from predictor import startup
    from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
    from predictor.metrics import create_metrics

    startup.create_metrics = lambda name: create_metrics(name, CollectorRegistry())
    config = ModelConfig(
        model_dir=package.parent,
        checkpoint=package.name,
        device=device,
        preprocess_workers=1,
        instances_per_device=instances,
    )
    batching = BatchingConfig(max_batch_size=batch, max_latency_ms=2, max_queue_size=64 * batch)
    return startup.build_model(config, batching, LimitsConfig())


def _samples(batch: int, size: int) -> list[Any]:
    from predictor.samples import PreparedSample

    rng = np.random.default_rng(0)
    return [
        PreparedSample(tile=rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
        for _ in range(batch)
    ]


async def throughput(model: Any, batch: int, clients: int, seconds: float) -> dict[str, Any]:
    """Tiles/s of ``clients`` closed-loop submitters of ``batch`` tiles, and batches per worker."""
    from predictor.model import resolve_mode

    samples = _samples(batch, model.model_spec.tile_size)
    mode = resolve_mode(model.model_spec, None, model.name)
    await model.start_batching()
    batcher = model._batcher  # the model's own batcher: no HTTP in this measurement
    done = 0
    end = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        while time.monotonic() < end:
            await asyncio.gather(*batcher.submit(samples, key=mode))
            done += batch

    start = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.monotonic() - start
    await batcher.close()
    batches = {w.name: w.batches for w in batcher.workers}
    return {"tiles_per_s": done / elapsed, "batches_per_worker": batches}


def copy_vs_compute(model: Any, batch: int, reps: int = 20) -> dict[str, float]:
    """Milliseconds per batch: copy+normalise, forward, both through ``forward_batch``."""
    import torch

    from predictor.model import resolve_mode

    samples = _samples(batch, model.model_spec.tile_size)
    mode = resolve_mode(model.model_spec, None, model.name)
    slot = model.active_slot()
    device = slot.package.device
    tiles = [s.tile for s in samples]

    def timed(fn: Any) -> float:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / reps * 1e3

    with torch.inference_mode():
        staged = slot.normalizer(tiles)
        copy_ms = timed(lambda: slot.normalizer(tiles))
        forward_ms = timed(lambda: slot.package(staged))
    total_ms = timed(lambda: model.forward_batch(samples, mode))
    hidden = max(0.0, copy_ms + forward_ms - total_ms)
    overlap = min(1.0, hidden / copy_ms) if copy_ms > 0 else 0.0
    return {"copy_ms": copy_ms, "forward_ms": forward_ms, "total_ms": total_ms, "overlap": overlap}


def _run(package: Path, device: str, args: argparse.Namespace) -> dict[str, Any]:
    model = build(package, device, args.batch)
    try:
        return asyncio.run(throughput(model, args.batch, args.clients, args.seconds))
    finally:
        model.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Runs both measurements on ``--device`` (``auto``: every GPU; ``cpu``: the dry run)."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_parts", description=__doc__)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="bf16", help="package dtype on CUDA")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args(argv)

    import torch

    from harness.packages import demo_package

    cuda = args.device != "cpu"
    package = demo_package("h0-mini", **({"device": "cuda", "dtype": args.dtype} if cuda else {}))
    first = "cuda:0" if cuda else "cpu"
    out: dict[str, Any] = {"device": args.device, "batch": args.batch, "clients": args.clients}
    out["gpus"] = torch.cuda.device_count() if cuda else 0
    out["one_device"] = _run(package, first, args)
    out["all_devices"] = _run(package, args.device, args)
    ratio = out["all_devices"]["tiles_per_s"] / out["one_device"]["tiles_per_s"]
    out["ratio"] = ratio
    print(
        f"every GPU used: {first} {out['one_device']['tiles_per_s']:.1f} tiles/s, "
        f"--device {args.device} ({out['gpus']} GPU(s)) "
        f"{out['all_devices']['tiles_per_s']:.1f} tiles/s: {ratio:.2f}x; batches per worker "
        f"{out['all_devices']['batches_per_worker']}"
    )
    model = build(package, first, args.batch)
    try:
        out["copy_vs_compute"] = copy_vs_compute(model, args.batch)
    finally:
        model.stop()
    print(f"copy vs compute on {first}, batch {args.batch}: {out['copy_vs_compute']}")
    try:
        build(package, first, args.batch, instances=2).stop()
        out["instances_on_device"] = "accepted"
    except ValueError as exc:
        out["instances_on_device"] = f"refused: {exc}"
    print(f"--instances_per_device 2 on {first}: {out['instances_on_device']}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
