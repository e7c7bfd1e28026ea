"""Event-loop progress while a forward runs, through torch's loader and the GIL-free runner.

``python -m bench.stages.gil [--preset tiny --batch 64 --forwards 4]``

A server's event loop (HTTP parsing, admission, batching the next requests)
runs while the device worker thread runs a forward. Through torch's
AOTInductor binding the worker holds the GIL for the whole CPU forward, so
the loop stands still; through :class:`predictor.runtime.aoti_runner.GilFreeRunner`
it is released. This script measures it the way the server lives it: the
forward runs in a worker thread (``run_in_executor``, as the batcher does)
while a coroutine on the loop ticks every millisecond. *Progress* is the
ticks the loop made during the forwards over the ticks it makes in an idle
stretch of the same length; *longest stall* is the largest gap between two
ticks. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

TICK_S = 0.001


async def _ticks_during(work: Callable[[], Any] | None, seconds: float) -> tuple[int, float, float]:
    """Loop ticks while ``work`` runs in a thread (or for ``seconds`` when None).

    Returns:
        ``(ticks, elapsed seconds, longest gap between ticks in seconds)``.
    """
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    ticks, gap, last = 0, 0.0, time.perf_counter()

    async def ticker() -> None:
        nonlocal ticks, gap, last
        while not done.is_set():
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
            ticks, gap, last = ticks + 1, max(gap, now - last), now

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)  # let the ticker start before the clock does
    start = time.perf_counter()
    if work is None:
        await asyncio.sleep(seconds)
    else:
        await loop.run_in_executor(None, work)
    elapsed = time.perf_counter() - start
    done.set()
    await task
    return ticks, elapsed, gap


async def measure(forward: Callable[[], Any], forwards: int) -> dict[str, float]:
    """Progress of the loop during ``forwards`` forwards vs an idle stretch as long."""

    def work() -> None:
        for _ in range(forwards):
            forward()

    ticks, elapsed, stall = await _ticks_during(work, 0.0)
    idle_ticks, idle_elapsed, _ = await _ticks_during(None, elapsed)
    idle_rate = idle_ticks / idle_elapsed
    return {
        "forward_ms": 1000.0 * elapsed / forwards,
        "ticks_per_s": ticks / elapsed,
        "idle_ticks_per_s": idle_rate,
        "progress": (ticks / elapsed) / idle_rate if idle_rate else 0.0,
        "longest_stall_ms": 1000.0 * stall,
    }


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Builds (or reuses) the package, measures both paths, returns the figures."""
    from predictor.packages.dtypes import DTYPES, dtype_from_name

    parser = argparse.ArgumentParser(prog="python -m bench.stages.gil", description=__doc__)
    parser.add_argument("--spec", default="h0-mini")
    parser.add_argument("--preset", default="tiny", help="demo preset (tiny, vit-s)")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="package dtype")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--forwards", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)

    import torch

    from harness.packages import demo_package
    from predictor.runtime.aoti_runner import GilFreeRunner

    dtype = dtype_from_name(args.dtype)  # the one dtype table, as the exporter reads it
    torch.set_num_threads(args.threads)
    opts = {} if args.dtype == "fp32" else {"dtype": args.dtype}
    path = demo_package(args.spec, args.preset, **opts)
    held = torch._inductor.aoti_load_package(str(path))
    free = GilFreeRunner(path, private_inputs=True)  # as the server: its inputs, no copy
    x = torch.randn(args.batch, 3, 224, 224).to(dtype).contiguous()
    inference = torch.inference_mode()
    with inference:
        held(x), free(x)  # warm both
        out: dict[str, Any] = {"package": str(path), "batch": args.batch, "threads": args.threads}
        out["torch_loader"] = asyncio.run(measure(lambda: held(x), args.forwards))
        out["gil_free_runner"] = asyncio.run(measure(lambda: free(x), args.forwards))
    free.close()
    return out


def section(part: dict[str, Any] | None) -> list[str]:
    """``results.md`` lines for the event loop's progress during a forward (empty when absent)."""
    if not part:
        return []
    lines = [
        "## The event loop during a CPU forward (`bench/stages/gil.py`)",
        "",
        f"`{Path(part['package']).name}`, batch {part['batch']}, {part['threads']} torch "
        "thread(s): how much of its idle progress an asyncio loop makes while another thread "
        "runs forwards (the loop admits and batches requests only when it progresses).",
        "",
        "| forward path | forward ms | loop progress | longest stall ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name in ("torch_loader", "gil_free_runner"):
        r = part[name]
        lines.append(
            f"| {name} | {r['forward_ms']:.1f} | {100 * r['progress']:.0f}% "
            f"| {r['longest_stall_ms']:.1f} |"
        )
    return [*lines, ""]


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the table and the JSON line."""
    out = run(argv)
    print(f"package {out['package']}, batch {out['batch']}, {out['threads']} torch thread(s)")
    print(f"{'path':<16} {'forward ms':>10} {'loop progress':>14} {'longest stall ms':>17}")
    for name in ("torch_loader", "gil_free_runner"):
        r = out[name]
        print(
            f"{name:<16} {r['forward_ms']:>10.1f} {100 * r['progress']:>13.0f}% "
            f"{r['longest_stall_ms']:>17.1f}"
        )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
