"""Issue 12's GPU-only parts, in process: every GPU used, and a batch's copy vs compute.

``python -m bench.gpu.parts [--device auto] [--seconds 15] [--batch 64] [--clients 8]
[--preset tiny]``

Run by ``bash bench/gpu/bench.sh parts`` on a CUDA node (a few minutes; the demo
package's CUDA export is cached; ``--preset vit-s`` or ``vit-g`` measures a
bigger demo ViT, at the cost of its first export). Three measurements through the real
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

* **Instances per device.** Tiles per second on the first device with one
  worker and with ``--instances_per_device 2`` (two workers, each with its
  own normaliser and CUDA stream, one package holding two model copies),
  two windows each, alternating, and each worker's batch count.

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
    from predictor.model.metrics import create_metrics

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


def _items(batch: int, size: int) -> list[Any]:
    """``batch`` random tiles as the batcher carries them: prepared sample and request."""
    from predictor.codecs.samples import ModelRequest, PreparedSample
    from predictor.model.forward import BatchItem

    rng = np.random.default_rng(0)
    tiles = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(batch)]
    return [
        BatchItem(PreparedSample(tile=t), ModelRequest(i, pixels=t)) for i, t in enumerate(tiles)
    ]


async def throughput(model: Any, batch: int, clients: int, seconds: float) -> dict[str, Any]:
    """Tiles/s of ``clients`` closed-loop submitters of ``batch`` tiles, and batches per worker."""
    items = _items(batch, model.model_spec.tile_size)
    mode = model.family.resolve_mode(None)
    await model.start_batching()
    batcher = model.batcher  # the model's own batcher: no HTTP in this measurement
    done = 0
    end = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        while time.monotonic() < end:
            await asyncio.gather(*batcher.submit(items, key=mode))
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

    items = _items(batch, model.model_spec.tile_size)
    samples, requests = [i.sample for i in items], [i.request for i in items]
    mode = model.family.resolve_mode(None)
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
    total_ms = timed(lambda: model.forward_batch(samples, requests, mode))
    hidden = max(0.0, copy_ms + forward_ms - total_ms)
    overlap = min(1.0, hidden / copy_ms) if copy_ms > 0 else 0.0
    return {"copy_ms": copy_ms, "forward_ms": forward_ms, "total_ms": total_ms, "overlap": overlap}


def _run(
    package: Path, device: str, args: argparse.Namespace, instances: int = 1
) -> dict[str, Any]:
    model = build(package, device, args.batch, instances)
    try:
        return asyncio.run(throughput(model, args.batch, args.clients, args.seconds))
    finally:
        model.stop()


def _instances(
    package: Path, first: str, args: argparse.Namespace, one: dict[str, Any]
) -> dict[str, Any]:
    """One worker vs two instances on ``first``, alternating (1 above, 2, 1, 2); prints the line.

    Each side's figure is the mean of its two windows, so a drift of the
    node during the run lands on both sides.
    """
    runs = [one]
    for instances in (2, 1, 2):
        runs.append(_run(package, first, args, instances=instances))
    ones = [r["tiles_per_s"] for r in runs[0::2]]
    twos = [r["tiles_per_s"] for r in runs[1::2]]
    ratio = (sum(twos) / 2) / (sum(ones) / 2)
    print(
        f"instances on {first}: 1 -> {ones[0]:.1f}, {ones[1]:.1f} tiles/s, "
        f"2 -> {twos[0]:.1f}, {twos[1]:.1f} tiles/s: {ratio:.2f}x; "
        f"batches per worker {runs[-1]['batches_per_worker']}"
    )
    return {
        "one_tiles_per_s": ones,
        "two_tiles_per_s": twos,
        "ratio": ratio,
        "two_batches_per_worker": runs[-1]["batches_per_worker"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the measurements on ``--device`` (``auto``: every GPU; ``cpu``: the dry run)."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.parts", description=__doc__)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="bf16", help="package dtype on CUDA")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--preset", default="tiny", help="demo ViT size (tiny, vit-s, vit-g)")
    args = parser.parse_args(argv)

    import torch

    from harness.packages import demo_package

    cuda = args.device != "cpu"
    opts = {"device": "cuda", "dtype": args.dtype} if cuda else {}
    package = demo_package("h0-mini", args.preset, **opts)
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
    out["instances"] = _instances(package, first, args, out["one_device"])
    out["instances_on_device"] = "accepted"  # start-up refuses none any more (CPU or CUDA)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
