"""The cost of crossing processes: CPU per request with N front ends against one, and one process's ceiling.

Part of the front-end stage (:mod:`bench.stages.frontends`), on its servers (the
null model at each server's defaults, so the request path is all there is):

- **Same offered load**: both servers get :data:`PACE_RPS` requests/s of
  single tiles from :data:`PACED_CLIENTS` clients over binary REST, gRPC and
  V1 base64 JPEG, each server alone in turn; the server's CPU seconds per
  request (device owner and front ends together) and their ratio, N against
  one (target: at most :data:`CPU_RATIO_GOAL`).
- **The batched ceiling of one process**: 16 clients of 32-tile ``pixels``
  requests over REST and gRPC, closed loop, on the one-process server:
  tiles/s and MB/s of raw pixels per server core, and from them how many
  cores of front ends a GPU that embeds :data:`GPU_TILES_PER_S` tiles/s
  (H0-mini on one H200) needs to be fed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.matrix.cells import Cell, LoadClient, with_cpu_per_request

PACE_RPS = 150.0
PACED_CLIENTS = 16
PACED_PROTOCOLS = ("v2-pixels", "v2-grpc", "v1-jpeg")
CPU_RATIO_GOAL = 1.15
CEILING_CLIENTS = 16
CEILING_TILES = 32
CEILING_PROTOCOLS = ("v2-pixels", "v2-grpc")
TILE_BYTES = 224 * 224 * 3
GPU_TILES_PER_S = 8000.0
"""H0-mini (ViT-B/14) in bf16 on one H200, the figure the issue sizes front ends for."""


def measure(
    client: LoadClient,
    servers: dict[str, Any],
    names: tuple[str, str],
    run: Callable[[LoadClient, Any, Cell], dict[str, Any]],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The paced cells on both servers, then the ceiling cells on the one-process server.

    Args:
        client: The load generator.
        servers: The stage's running servers by name.
        names: ``(one process, N front ends)`` among ``servers``.
        run: Runs one cell against one server (the stage's timing).
        log: Progress lines.
    """
    one, many = names
    paced = []
    for protocol in PACED_PROTOCOLS:
        for name in (one, many):
            cell = Cell(name, protocol, PACED_CLIENTS, 1, target=True, pace_rps=PACE_RPS)
            result = with_cpu_per_request(run(client, servers[name], cell))
            log(f"  paced {name} {protocol}: {result.get('cpu_ms_per_request')} CPU ms/request")
            paced.append(result)
    ceiling = []
    for protocol in CEILING_PROTOCOLS:
        cell = Cell(one, protocol, CEILING_CLIENTS, CEILING_TILES, target=True)
        result = per_core(run(client, servers[one], cell))
        log(f"  ceiling {protocol}: {result.get('tiles_per_s_per_core')} tiles/s per core")
        ceiling.append(result)
    return {"paced": paced, "ratios": cpu_ratios(paced, one, many), "ceiling": ceiling}


def per_core(result: dict[str, Any]) -> dict[str, Any]:
    """Adds tiles/s and MB/s per server core, and the cores a GPU's rate needs."""
    cores, tiles = result.get("server_cores"), result.get("throughput")
    if cores and tiles:
        result["tiles_per_s_per_core"] = tiles / cores
        result["mb_per_s_per_core"] = tiles * TILE_BYTES / cores / 1e6
        result["cores_for_gpu"] = GPU_TILES_PER_S / result["tiles_per_s_per_core"]
    return result


def cpu_ratios(paced: list[dict[str, Any]], one: str, many: str) -> list[dict[str, Any]]:
    """Per protocol: CPU per request with N front ends over one process's, against the goal."""
    out = []
    for protocol in PACED_PROTOCOLS:
        cpu = {c["server"]: c.get("cpu_ms_per_request") for c in paced if c["protocol"] == protocol}
        if cpu.get(one) and cpu.get(many):
            ratio = cpu[many] / cpu[one]
            out.append({
                "target": f"CPU per request, N front ends vs one, {protocol} at {PACE_RPS:.0f}/s",
                "ratio": ratio, "goal": CPU_RATIO_GOAL, "met": ratio <= CPU_RATIO_GOAL,
                "at_most": True,
            })  # fmt: skip
    return out


def section(part: dict[str, Any] | None) -> list[str]:
    """``results.md`` lines (empty when it did not run)."""
    if not part:
        return []

    def f(value: Any, digits: int) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    lines = [
        f"### Crossing processes: the same offered load ({PACE_RPS:.0f} single-tile requests/s, "
        f"{PACED_CLIENTS} clients)",
        "",
        "| server | protocol | requests/s | CPU ms / request | p50 ms | p99 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for c in part["paced"]:
        lines.append(
            f"| {c['server']} | {c['protocol']} | {f(c.get('requests_per_s'), 0)} "
            f"| {f(c.get('cpu_ms_per_request'), 3)} | {f(c.get('p50_ms'), 1)} "
            f"| {f(c.get('p99_ms'), 1)} |"
        )
    lines += [
        "",
        f"### One process's batched ceiling ({CEILING_CLIENTS} clients x {CEILING_TILES}-tile "
        "`pixels` requests, null model)",
        "",
        "| protocol | tiles/s | server cores | tiles/s per core | MB/s per core "
        f"| cores for {GPU_TILES_PER_S:.0f} tiles/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in part["ceiling"]:
        lines.append(
            f"| {c['protocol']} | {f(c.get('throughput'), 0)} | {f(c.get('server_cores'), 2)} "
            f"| {f(c.get('tiles_per_s_per_core'), 0)} | {f(c.get('mb_per_s_per_core'), 0)} "
            f"| {f(c.get('cores_for_gpu'), 1)} |"
        )
    return [*lines, ""]
