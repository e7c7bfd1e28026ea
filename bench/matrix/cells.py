"""End-to-end cells: plan the matrix, size each window, drive the load process.

A cell is one (server, protocol, concurrency, tiles per request) point under
closed-loop load. Windows scale with one round's expected time at the
model's own speed (``concurrency * tiles / limit``), clamped by the profile,
so a fast model gets short cells and a slow one gets enough completions.
Cells with more tiles in flight than the model case allows are skipped and
say why (a 64 x 32-tile round of a CPU ViT takes over a minute).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.profiles import ModelCase, Profile, Windows
from bench.servers.launch import bench_env
from harness.server import REPO, Server


@dataclass(frozen=True)
class Cell:
    """One point of the matrix."""

    server: str
    protocol: str
    concurrency: int
    tiles: int
    target: bool = False  # a target cell: longer window, never skipped
    pace_rps: float | None = None  # offered load (requests/s over all clients); None: closed loop


class LoadClient:
    """The load generator process (:mod:`bench.load.generator`), one JSON line per cell."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.load.generator"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO,
            text=True,
            env=bench_env(1),
        )

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """Sends one job and waits for its result (the job bounds its own time)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(job) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator exited ({self._proc.poll()})")
        return json.loads(line)

    def close(self) -> None:
        """Ends the load process (closing stdin ends its loop)."""
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def plan_matrix(profile: Profile, case: ModelCase) -> list[Cell]:
    """Every (protocol, concurrency, tiles) cell of the histoserve matrix, in run order."""
    return [
        Cell("histoserve", protocol, c, n)
        for n in profile.tile_counts
        for protocol in case.protocols
        for c in profile.concurrencies
    ]


def skip_reason(cell: Cell, case: ModelCase, speed_tps: float) -> str | None:
    """Why a cell is not run (too many tiles in flight for this model), or None."""
    inflight = cell.concurrency * cell.tiles
    if not cell.target and inflight > case.max_inflight_tiles:
        return (
            f"{inflight} tiles in flight > {case.max_inflight_tiles} for this model "
            f"(one round ~{inflight / speed_tps:.0f} s)"
        )
    return None


def timing(cell: Cell, speed_tps: float, windows: Windows) -> dict[str, float]:
    """Warm-up, window and drain bound for a cell, from its expected round time.

    Args:
        cell: The cell.
        speed_tps: Expected tiles/s of the cell's server (the limit for
            histoserve, the idle single-tile rate for the naive baseline).
        windows: The profile's bounds.
    """
    round_s = cell.concurrency * cell.tiles / max(speed_tps, 1e-6)
    warmup = min(max(windows.warmup_rounds * round_s, windows.warmup_min_s), windows.warmup_max_s)
    if cell.target:
        window = min(
            max(windows.target_rounds * round_s, windows.target_min_s), windows.target_max_s
        )
    else:
        rounds = max(windows.window_rounds, windows.min_completions / cell.concurrency)
        window = min(max(rounds * round_s, windows.window_min_s), windows.window_max_s)
    drain = min(windows.timeout_s, 10.0 + 3.0 * round_s)
    return {"warmup_s": warmup, "window_s": window, "drain_s": drain}


def run_cell(
    client: LoadClient,
    server: Server,
    cell: Cell,
    *,
    tile_size: int,
    speed_tps: float,
    windows: Windows,
) -> dict[str, Any]:
    """Runs one cell against ``server``; the result carries the cell's coordinates."""
    job = {
        "protocol": cell.protocol,
        "concurrency": cell.concurrency,
        "tiles": cell.tiles,
        "model": server.model_name,
        "http": server.http_url,
        "grpc": server.grpc_url,
        "tile_size": tile_size,
        "max_requests": windows.max_requests,
        "timeout_s": windows.timeout_s,
        "server_pid": server.pid,
        "metrics": server.kind != "naive",
        "pace_rps": cell.pace_rps,
        **timing(cell, speed_tps, windows),
    }
    result = client.run(job)
    return {**asdict(cell), **{k: job[k] for k in ("warmup_s", "drain_s")}, **result}


def with_cpu_per_request(result: dict[str, Any]) -> dict[str, Any]:
    """Adds ``cpu_ms_per_request`` (server cores over requests/s) where both were measured."""
    rps, cores = result.get("requests_per_s"), result.get("server_cores")
    if rps and cores is not None:
        result["cpu_ms_per_request"] = 1000.0 * cores / rps
    return result


def run_cells(
    client: LoadClient,
    servers: dict[str, Server],
    cells: list[Cell],
    *,
    case: ModelCase,
    tile_size: int,
    speeds: Mapping[str, float],
    windows: Windows,
    deadline: float = float("inf"),
    log: Any = print,
) -> list[dict[str, Any]]:
    """Runs ``cells`` in order (skipping the ones :func:`skip_reason` refuses).

    ``speeds`` maps a server kind to its expected tiles/s (see :func:`timing`);
    after ``deadline`` (monotonic seconds) the remaining cells are skipped.
    """
    results = []
    for cell in cells:
        reason = skip_reason(cell, case, speeds[cell.server])
        if reason is None and time.monotonic() > deadline:
            reason = "the run's time budget for cells was spent (machine slower than usual)"
        if reason:
            results.append({**asdict(cell), "skipped": reason})
            continue
        result = run_cell(
            client,
            servers[cell.server],
            cell,
            tile_size=tile_size,
            speed_tps=speeds[cell.server],
            windows=windows,
        )
        log(_one_line(case.label, result))
        results.append(result)
    return results


def _one_line(label: str, r: dict[str, Any]) -> str:
    if "failed" in r:
        return f"  {label} {r['server']} {r['protocol']} c={r['concurrency']} n={r['tiles']}: FAILED {r['failed']}"
    p50 = r.get("p50_ms")
    return (
        f"  {label} {r['server']:<10} {r['protocol']:<9} c={r['concurrency']:<3} n={r['tiles']:<3}"
        f" {r['throughput']:8.1f} tiles/s  p50 {p50 if p50 is None else round(p50, 1)} ms"
        f"  batch {r.get('mean_batch', float('nan')):.1f}  errors {r['errors'] or 0}"
    )


def run_alone(
    measure: Callable[..., dict[str, Any]],
    section: Callable[[dict[str, Any]], list[str]],
    out: Path,
    **options: Any,
) -> int:
    """A ``make bench`` stage run on its own (``python -m bench.<stage>``), full profile.

    Prints the stage's Markdown and writes its results to ``out`` (JSON);
    the servers' logs go beside it.
    """
    from bench.profiles import PROFILES

    client = LoadClient()
    try:
        part = measure(PROFILES["full"], client, out.parent / f"{out.stem}-logs", print, **options)
    finally:
        client.close()
    print("\n".join(section(part)))
    out.write_text(json.dumps(part, indent=1, default=str))
    return 0
