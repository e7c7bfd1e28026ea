"""Single-tile requests per second on a "null" model: the serving path's own ceiling.

The package is :mod:`bench.servers.null_model` (``h0-mini`` geometry, a forward of
tens of microseconds per tile), so what a server sustains here is what its
request path costs: the figure that says how many tiles per second a GPU can
be fed from single-tile clients, and the CPU time per request behind it
(issue 12). histoserve (the benchmark's batching settings) and, when its venv
is installed, Triton (same settings, see :mod:`bench.triton.baseline`) each get the
many-clients single-tile cell over V2 binary REST and gRPC, and so does the
server as it was before issue 12's request-path work (:mod:`bench.servers.before`),
for the issue's "before and after".
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.matrix.cells import Cell, LoadClient, with_cpu_per_request
from bench.profiles import Profile

PROTOCOLS = ("v2-pixels", "v2-grpc")
EXPECTED_RPS = 500.0  # sizes the windows only


def _start(profile: Profile, package: Path, log_dir: Path) -> dict[str, Any]:
    from bench.servers import before, launch
    from bench.triton import baseline

    settings = {
        "model": "bench",
        "device": profile.device,
        "max_batch_size": 32,
        "max_latency_ms": 5.0,
        "max_queue_size": profile.max_queue_size,
        "workers": profile.preprocess_workers,
        "threads": profile.threads,
        "log_dir": log_dir,
    }
    started = {"histoserve": launch.start_histoserve(package, kind="histoserve-null", **settings)}
    if profile.null_before:
        source = before.source_tree()
        started[f"histoserve@{before.BEFORE_COMMIT}"] = launch.start_histoserve(
            package, kind="histoserve-before", source=source, **settings
        )
    if baseline.wanted(profile) is None:
        started["triton"] = baseline.start_triton(
            package,
            model="bench",
            device=profile.device,
            max_batch_size=32,
            max_latency_ms=5.0,
            threads=profile.threads,
            log_dir=log_dir,
        )
    launch.wait_all_ready(started)
    return started


def measure(
    profile: Profile, client: LoadClient, log_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Requests/s and server CPU per request, per server and protocol."""
    from bench.triton import baseline
    from harness.packages import module_package

    package = module_package("h0-mini", "bench.servers.null_model:build")
    clients = profile.target_clients[2]
    started = _start(profile, package, log_dir)
    cells = []
    try:
        for protocol in PROTOCOLS:
            for name, server in started.items():
                cell = Cell(name, protocol, clients, 1, target=True)
                result = baseline.run_cell_counted(  # Triton's mean batch from its counters
                    client,
                    server,
                    cell,
                    tile_size=224,
                    speed_tps=EXPECTED_RPS,
                    windows=profile.windows,
                )
                with_cpu_per_request(result)
                log(
                    f"  null model {name} {protocol} {clients}x1: "
                    f"{result.get('requests_per_s', 0):.0f} req/s, "
                    f"{result.get('cpu_ms_per_request', float('nan')):.2f} ms CPU/request"
                )
                cells.append(result)
    finally:
        for server in started.values():
            server.stop()
    return {"package": str(package), "clients": clients, "cells": cells}


def section(part: dict[str, Any] | None) -> list[str]:
    """``results.md`` lines for the null-model cells (empty when absent)."""
    if not part:
        return []
    lines = [
        f"## Null model: single-tile requests per second ({part['clients']} clients)",
        "",
        "`bench/servers/null_model.py` (forward of tens of microseconds per tile): what each server's "
        "request path sustains, and its CPU per request (server process tree, all threads).",
        "",
        "| server | protocol | requests/s | CPU ms / request | p50 ms | p99 ms | mean batch "
        "| cores: server / client / other |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in part["cells"]:
        if "failed" in c:
            lines.append(f"| {c['server']} | {c['protocol']} | failed: {c['failed']} | | | | | |")
            continue
        lines.append(
            f"| {c['server']} | {c['protocol']} | {c['requests_per_s']:.0f} "
            f"| {c.get('cpu_ms_per_request', float('nan')):.2f} | {c['p50_ms']:.1f} "
            f"| {c['p99_ms']:.1f} | {c.get('mean_batch', float('nan')):.1f} "
            f"| {c.get('server_cores', float('nan')):.2f} / {c.get('client_cores', float('nan')):.2f}"
            f" / {c.get('other_cores', float('nan')):.2f} |"
        )
    return [*lines, ""]
