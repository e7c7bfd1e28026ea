"""The three target cells, measured side by side so the ratios survive a noisy host.

- Serving efficiency: the package's forward at the batch size is measured
  right before and right after the end-to-end window, and the end-to-end
  throughput is divided by their mean (their spread is reported).
- Many single-tile clients: histoserve and baseline (b) alternate (H, B, H, B)
  with equal windows; the ratio is of the means. Baseline (a) runs once.
- Idle latency: in-process single-tile forwards and single requests to each
  idle server alternate, rotating the order; the overhead is the median of
  the paired differences.
"""

from __future__ import annotations

import http.client
import statistics
import time
from dataclasses import replace
from typing import Any

from bench.load.payloads import build_payload, synthetic_tiles
from bench.matrix.cells import Cell, LoadClient, run_cell
from bench.matrix.limit import ForwardRunner
from bench.profiles import Profile
from harness.server import Server

IDLE_BUDGET_MS = 5.0
EFFICIENCY_TARGET = 0.85
CLIENTS_TARGET = 3.0


class _Requester:
    """Sends one pre-built single-tile V2 binary request over a kept-alive connection."""

    def __init__(self, server: Server, tile_size: int):
        payload = build_payload(
            "v2-pixels", server.model_name, synthetic_tiles(1, tile_size, seed=1)
        )
        self._payload = payload
        self._conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)

    def __call__(self) -> float:
        start = time.perf_counter()
        self._conn.request("POST", self._payload.path, self._payload.body, self._payload.headers)
        response = self._conn.getresponse()
        response.read()
        took = time.perf_counter() - start
        if response.status != 200:
            raise RuntimeError(f"idle request failed with HTTP {response.status}")
        return took

    def close(self) -> None:
        self._conn.close()


def idle_latency(
    runner: ForwardRunner, servers: dict[str, Server], pairs: int, tile_size: int
) -> dict[str, Any]:
    """Single-tile forward vs single-request latency on each idle server, interleaved."""
    calls = {"forward": lambda: runner.forward_s(1)}
    requesters = {name: _Requester(s, tile_size) for name, s in servers.items()}
    calls.update(requesters)
    names = list(calls)
    times: dict[str, list[float]] = {n: [] for n in names}
    for fn in calls.values():  # warm every path once
        fn()
    for i in range(pairs):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            times[name].append(1000.0 * calls[name]())
            time.sleep(0.005)
    for r in requesters.values():
        r.close()
    fwd = times["forward"]
    out: dict[str, Any] = {"pairs": pairs, "forward_ms": statistics.median(fwd)}
    for name in requesters:
        diffs = [t - f for t, f in zip(times[name], fwd, strict=True)]
        out[name] = {
            "median_ms": statistics.median(times[name]),
            "p90_ms": sorted(times[name])[int(0.9 * (pairs - 1))],
            "overhead_ms": statistics.median(diffs),
        }
    return out


def efficiency(
    runner: ForwardRunner,
    client: LoadClient,
    server: Server,
    profile: Profile,
    tile_size: int,
) -> dict[str, Any]:
    """End-to-end V2 binary pixels at (C, N) from the profile over the bracketed limit at N."""
    clients, tiles, _ = profile.target_clients
    budget = max(profile.windows.limit_s, 3.0 if profile.name != "tiny" else 0.3)
    before = runner.measure(tiles, budget)["tiles_per_s"]
    cell = Cell("histoserve", "v2-pixels", clients, tiles, target=True)
    e2e = run_cell(
        client, server, cell, tile_size=tile_size, speed_tps=before, windows=profile.windows
    )
    after = runner.measure(tiles, budget)["tiles_per_s"]
    limit = (before + after) / 2
    out = {"cell": e2e, "limit_before": before, "limit_after": after, "limit": limit}
    if "throughput" in e2e:
        out["efficiency"] = e2e["throughput"] / limit
        out["efficiency_range"] = [
            e2e["throughput"] / max(before, after),
            e2e["throughput"] / min(before, after),
        ]
        if e2e.get("forward_ms_per_batch"):
            in_server = 1000.0 * e2e["mean_batch"] / e2e["forward_ms_per_batch"]
            out["in_server_forward_vs_limit"] = in_server / limit
        out["met"] = out["efficiency"] >= EFFICIENCY_TARGET
    return out


def many_clients(
    client: LoadClient,
    servers: dict[str, Server],
    profile: Profile,
    tile_size: int,
    speeds: dict[str, float],
) -> dict[str, Any]:
    """histoserve vs baseline (b) at many single-tile clients, alternating H, B, H, B, then A."""
    clients = profile.target_clients[2]
    base = Cell("histoserve", "v2-pixels", clients, 1, target=True)
    order = ["histoserve", "naive", "histoserve", "naive", "nobatch"]
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in dict.fromkeys(order)}
    for name in order:
        cell = replace(base, server=name)
        runs[name].append(
            run_cell(
                client,
                servers[name],
                cell,
                tile_size=tile_size,
                speed_tps=speeds[name],
                windows=profile.windows,
            )
        )
    mean = {n: statistics.mean(r.get("throughput", 0.0) for r in rs) for n, rs in runs.items()}
    out: dict[str, Any] = {"runs": runs, "throughput": mean, "clients": clients}
    out["limit"] = speeds["histoserve"]
    out["of_limit"] = mean["histoserve"] / speeds["histoserve"]
    if mean["naive"] > 0:
        out["vs_naive"] = mean["histoserve"] / mean["naive"]
        out["ceiling_vs_naive"] = speeds["histoserve"] / mean["naive"]  # histoserve at the limit
        out["met"] = out["vs_naive"] >= CLIENTS_TARGET
    if mean["nobatch"] > 0:
        out["vs_nobatch"] = mean["histoserve"] / mean["nobatch"]
    return out
