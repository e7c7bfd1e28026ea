"""The demo package against Triton with each server at its defaults, as users run them.

``python -m bench.stages.defaults [--rounds 2] [--out FILE.json]``, and a ``make
bench`` stage. histoserve starts with nothing but the package, its name and
its ports (:func:`bench.servers.launch.start_histoserve_defaults`); Triton as a
user would first configure it (:func:`bench.triton.baseline.start_triton_defaults`).
After checking that both serve the package's own embeddings, each runs 64
single-tile clients over V2 binary REST and gRPC, and 16 clients of 32
tiles over binary REST, alternating, ``--rounds`` times. The 16 x 32 cell
is also divided by the package's in-process limit at batch 32, measured
right before and after it with torch's own thread count (as the servers
run it). The targets: >= 1.25x Triton over REST and gRPC at 64 x 1 with a
p99 no higher than Triton's, and >= 0.9 of the limit at 16 x 32.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.markdown import target_rows
from bench.matrix.cells import Cell, LoadClient, run_alone
from bench.profiles import Profile

CELLS = (("v2-pixels", 64, 1), ("v2-grpc", 64, 1), ("v2-pixels", 16, 32))
VS_TRITON_GOAL = 1.25
OF_LIMIT_GOAL = 0.9
LIMIT_BATCH = 32


def start(package: Path, profile: Profile, log_dir: Path, triton: bool) -> dict[str, Any]:
    """histoserve (and Triton when wanted) at their defaults, ready."""
    from bench.servers import launch
    from bench.triton.baseline import ready_beside_triton

    started: dict[str, Any] = {
        "histoserve": launch.start_histoserve_defaults(
            package, model="bench", log_dir=log_dir, kind="histoserve-defaults"
        )
    }
    return ready_beside_triton(
        started, package, device=profile.device, log_dir=log_dir, triton=triton
    )


def measure(
    profile: Profile,
    client: LoadClient,
    log_dir: Path,
    log: Callable[[str], None],
    *,
    rounds: int = 2,
) -> dict[str, Any]:
    """Every cell on each server, ``rounds`` times; the limit around each 16 x 32 window."""
    from bench.matrix.limit import ForwardRunner
    from bench.servers.packages import package_for
    from bench.triton import baseline

    case = profile.models[0]
    package = package_for(case, profile.device)
    runner = ForwardRunner(package, profile.device)
    started = start(package, profile, log_dir, baseline.wanted(profile) is None)
    part: dict[str, Any] = {"package": str(package), "cells": [], "limits": []}
    try:
        part["embeddings"] = baseline.check_embeddings(package, started) if "triton" in started else None  # fmt: skip
        for _ in range(rounds):
            for protocol, clients, tiles in CELLS:
                limit = _limit(runner, profile) if tiles > 1 else None
                for name, server in started.items():
                    result = baseline.run_cell_counted(
                        client, server, Cell(name, protocol, clients, tiles, target=True),
                        tile_size=224, speed_tps=limit or 200.0, windows=profile.windows,
                    )  # fmt: skip
                    log(f"  defaults {name} {protocol} {clients}x{tiles}: "
                        f"{result.get('throughput', 0):.1f} tiles/s p99 {result.get('p99_ms')}")  # fmt: skip
                    part["cells"].append(result)
                if limit is not None:
                    part["limits"].append([limit, _limit(runner, profile)])
    finally:
        for server in started.values():
            server.stop()
    part["targets"] = targets(part["cells"], part["limits"])
    return part


def _limit(runner: Any, profile: Profile) -> float:
    """Tiles/s of the package's forward at batch 32 with torch's default thread count."""
    import torch

    pinned = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        return runner.measure(LIMIT_BATCH, max(profile.windows.limit_s, 3.0))["tiles_per_s"]
    finally:
        torch.set_num_threads(pinned)


def _mean(cells: list[dict[str, Any]], server: str, protocol: str, tiles: int, key: str) -> float:
    values = [
        c[key]
        for c in cells
        if (c["server"], c["protocol"], c["tiles"]) == (server, protocol, tiles) and c.get(key)
    ]
    return statistics.mean(values) if values else 0.0


def targets(cells: list[dict[str, Any]], limits: list[list[float]]) -> list[dict[str, Any]]:
    """The issue's demo-package targets, from the means over rounds (absent cells skipped)."""
    out = []
    for protocol in ("v2-pixels", "v2-grpc"):
        ours, theirs = (_mean(cells, s, protocol, 1, "throughput") for s in ("histoserve", "triton"))  # fmt: skip
        if ours and theirs:
            p99 = [_mean(cells, s, protocol, 1, "p99_ms") for s in ("histoserve", "triton")]
            ratio = ours / theirs
            out.append({"target": f"64 x 1 {protocol} vs Triton", "ratio": ratio,
                        "goal": VS_TRITON_GOAL, "p99_ms": p99,
                        "met": ratio >= VS_TRITON_GOAL and p99[0] <= p99[1]})  # fmt: skip
    e2e = _mean(cells, "histoserve", "v2-pixels", 32, "throughput")
    if e2e and limits:
        limit = statistics.mean(v for pair in limits for v in pair)
        out.append({"target": "16 x 32 binary REST of the in-process limit", "ratio": e2e / limit,
                    "goal": OF_LIMIT_GOAL, "limit_tps": limit, "met": e2e / limit >= OF_LIMIT_GOAL})  # fmt: skip
    return out


def section(part: dict[str, Any] | None) -> list[str]:
    """``results.md`` lines for the stage (empty when it did not run)."""
    if not part:
        return []
    lines = [
        "## Demo package, each server at its defaults",
        "",
        "histoserve: only `--checkpoint`, `--model_name` and the ports; Triton: "
        "max batch 32, its dynamic batcher's default (no queue delay), one instance, "
        "torch's own thread count.",
        "",
        "| server | protocol | clients x tiles | tiles/s | p50 ms | p99 ms | mean batch "
        "| cores: server / client / other |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for c in part["cells"]:
        lines.append(
            f"| {c['server']} | {c['protocol']} | {c['concurrency']} x {c['tiles']} "
            f"| {c.get('throughput', 0):.1f} | {c.get('p50_ms') or 0:.1f} | {c.get('p99_ms') or 0:.1f} "
            f"| {c.get('mean_batch') or 0:.1f} | {c.get('server_cores') or 0:.2f} / "
            f"{c.get('client_cores') or 0:.2f} / {c.get('other_cores') or 0:.2f} |"
        )
    return [*lines, "", *target_rows(part["targets"]), ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("/tmp/histoserve-defaults.json"))
    args = parser.parse_args(argv)
    return run_alone(measure, section, args.out, rounds=args.rounds)


if __name__ == "__main__":
    raise SystemExit(main())
