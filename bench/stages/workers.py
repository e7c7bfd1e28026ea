"""Throughput of one vs two device workers behind the batcher, per forward path.

``python -m bench.stages.workers [--seconds 6 --batch 8 --clients 8]``

Issue 12's CPU stand-in for "every GPU used": a package whose forward leaves
a core free (one torch thread per worker on a 2-core machine) should run
about twice as fast on two workers as on one. Here the real
:class:`~predictor.batching.batcher.DynamicBatcher` feeds one or two workers, each
calling the tiny demo package on a batch of ``--batch`` tiles, with
``--clients`` closed-loop submitters on the event loop, for each forward
path: torch's loader (holds the GIL for the whole forward, so two workers
cannot overlap) and :class:`~predictor.runtime.aoti_runner.GilFreeRunner` (two model
copies in one container, GIL released). No HTTP: this isolates the workers.
Prints one line per path and a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from bench.load.probes import machine_busy_s, process_cpu_s
from bench.markdown import number


async def throughput(
    forward: Callable[[Any], Any], x: Any, workers: int, clients: int, seconds: float
) -> dict[str, float | None]:
    """Tiles per second through a batcher with ``workers`` workers calling ``forward``,
    and the cores other processes used meanwhile (a busy machine shows there)."""
    from predictor.batching.batcher import DynamicBatcher
    from predictor.config import BatchingConfig

    batch = len(x)

    def run_batch(items: list[Any], key: Hashable) -> list[Any]:
        forward(x[: len(items)].contiguous())
        return items

    config = BatchingConfig(max_batch_size=batch, max_latency_ms=1, max_queue_size=64 * batch)
    batcher: DynamicBatcher[Any, Any] = DynamicBatcher(
        {f"w{i}": run_batch for i in range(workers)}, config, name="bench"
    )
    await batcher.start()
    done = 0
    end = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        while time.monotonic() < end:
            await asyncio.gather(*batcher.submit(list(range(batch))))
            done += batch

    start, busy0, own0 = time.monotonic(), machine_busy_s(), process_cpu_s(os.getpid())
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.monotonic() - start
    busy1, own1 = machine_busy_s(), process_cpu_s(os.getpid())
    await batcher.close()
    other = None
    if None not in (busy0, busy1, own0, own1):
        other = max(0.0, (busy1 - busy0 - (own1 - own0)) / elapsed)  # type: ignore[operator]
    return {"tiles_per_s": done / elapsed, "other_cores": other}


def measure(seconds: float = 6.0, batch: int = 8, clients: int = 8) -> dict[str, Any]:
    """Both forward paths with one and two workers (one torch thread each); the ratios."""
    import torch

    from harness.packages import demo_package
    from predictor.runtime.aoti_runner import GilFreeRunner

    torch.set_num_threads(1)
    path = demo_package("h0-mini")
    x = torch.randn(batch, 3, 224, 224)
    paths = {
        "torch_loader": torch._inductor.aoti_load_package(str(path)),
        "gil_free_runner": GilFreeRunner(path, num_models=2, private_inputs=True),  # as served
    }
    out: dict[str, Any] = {"batch": batch, "clients": clients, "torch_threads": 1}
    for name, forward in paths.items():
        forward(x)  # warm
        one = asyncio.run(throughput(forward, x, 1, clients, seconds))
        two = asyncio.run(throughput(forward, x, 2, clients, seconds))
        ratio = two["tiles_per_s"] / one["tiles_per_s"]  # type: ignore[operator]
        out[name] = {"one_worker": one, "two_workers": two, "ratio": ratio}
    paths["gil_free_runner"].close()
    return out


def section(part: dict[str, Any] | None) -> list[str]:
    """``results.md`` lines for the workers stage (empty when absent)."""
    if not part:
        return []
    lines = [
        "## Two device workers on one queue (`bench/stages/workers.py`)",
        "",
        f"The real batcher, the tiny demo package at batch {part['batch']}, "
        f"{part['clients']} closed-loop submitters, one torch thread per worker, no HTTP. "
        "Goal (issue 12): two workers >= 1.6x one where the forward leaves a core free.",
        "",
        "| forward path | 1 worker tiles/s | 2 workers tiles/s | ratio | other cores (1 / 2) |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name in ("torch_loader", "gil_free_runner"):
        r = part[name]
        one, two = r["one_worker"], r["two_workers"]
        lines.append(
            f"| {name} | {one['tiles_per_s']:.1f} | {two['tiles_per_s']:.1f} "
            f"| {r['ratio']:.2f}x | {number(one.get('other_cores'), 2)} / {number(two.get('other_cores'), 2)} |"
        )
    return [*lines, ""]


def main(argv: Sequence[str] | None = None) -> int:
    """Measures both paths with one and two workers; prints the ratios."""
    parser = argparse.ArgumentParser(prog="python -m bench.stages.workers", description=__doc__)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args(argv)
    out = measure(args.seconds, args.batch, args.clients)
    for name in ("torch_loader", "gil_free_runner"):
        one, two = out[name]["one_worker"], out[name]["two_workers"]
        print(
            f"{name:<16} 1 worker {one['tiles_per_s']:7.1f} tiles/s, 2 workers "
            f"{two['tiles_per_s']:7.1f} tiles/s: {out[name]['ratio']:.2f}x (other processes: "
            f"{number(one.get('other_cores'), 2)} / {number(two.get('other_cores'), 2)} cores)"
        )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
