"""The request path at each server's defaults: one front end against N, beside Triton.

``python -m bench.stages.frontends [--frontends 2] [--rounds 2] [--out FILE.json]``,
and a ``make bench`` stage. The package is :mod:`bench.servers.null_model` (a forward
of tens of microseconds), so what a server sustains is what its request path
costs. Three servers start side by side, each at its defaults
(:func:`bench.servers.launch.start_histoserve_defaults`,
:func:`bench.triton.baseline.start_triton_defaults`): histoserve with one front end,
histoserve with ``--frontends N``, and Triton when its venv exists. Each
gets 64 single-tile clients over V2 binary REST, V2 gRPC, V1 base64 JPEG
and V2 JSON base64 JPEG (real H&E, quality 90; Triton takes the first two
only), in turn, ``--rounds`` times. Reported: requests/s, server CPU per
request (the whole process tree: device owner and front ends), p50/p99, and
the cores the load client and everything else used meanwhile; then the
ratios the issue's targets name, each marked met or missed. Then, on the
same servers, the cost of crossing processes (:mod:`bench.stages.crossing`): CPU per
request at one offered load, and one process's batched ceiling per core.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.markdown import target_rows
from bench.matrix.cells import Cell, LoadClient, run_alone, with_cpu_per_request
from bench.profiles import Profile
from bench.stages import crossing

PROTOCOLS = ("v2-pixels", "v2-grpc", "v1-jpeg", "v2-json-jpeg")
TRITON_PROTOCOLS = ("v2-pixels", "v2-grpc")
CLIENTS = 64
EXPECTED_RPS = 500.0  # sizes the windows only
ONE = "histoserve"

# (what, numerator (server, protocol), denominator (server, protocol), goal)
# "N" stands for the histoserve server with N front ends.
RATE_TARGETS = (
    ("N front ends vs one, binary REST", ("N", "v2-pixels"), (ONE, "v2-pixels"), 1.5),
    ("N front ends vs one, gRPC", ("N", "v2-grpc"), (ONE, "v2-grpc"), 1.5),
    ("N front ends vs one, V1 base64 JPEG", ("N", "v1-jpeg"), (ONE, "v1-jpeg"), 1.5),
    ("defaults vs Triton, binary REST", (ONE, "v2-pixels"), ("triton", "v2-pixels"), 2.0),
    ("defaults vs Triton, gRPC", (ONE, "v2-grpc"), ("triton", "v2-grpc"), 1.4),
    ("V1 base64 JPEG vs Triton's binary REST", (ONE, "v1-jpeg"), ("triton", "v2-pixels"), 1.2),
    (
        "V2 JSON base64 JPEG vs Triton's binary REST",
        (ONE, "v2-json-jpeg"),
        ("triton", "v2-pixels"),
        0.8,
    ),
)


def frontends_name(n: int) -> str:
    """The result name of the histoserve server with ``n`` front ends."""
    return ONE if n == 1 else f"histoserve --frontends {n}"


def start(frontends: int, log_dir: Path, device: str, triton: bool) -> dict[str, Any]:
    """The servers of the stage, ready: histoserve with 1 and N front ends, Triton if wanted."""
    from bench.servers import launch
    from bench.triton.baseline import ready_beside_triton
    from harness.packages import module_package

    package = module_package("h0-mini", "bench.servers.null_model:build")
    started: dict[str, Any] = {
        frontends_name(n): launch.start_histoserve_defaults(
            package, model="bench", log_dir=log_dir, kind=f"histoserve-fe{n}", frontends=n
        )
        for n in (1, frontends)
    }
    return ready_beside_triton(started, package, device=device, log_dir=log_dir, triton=triton)


def measure(
    profile: Profile,
    client: LoadClient,
    log_dir: Path,
    log: Callable[[str], None],
    *,
    frontends: int = 2,
    rounds: int = 2,
) -> dict[str, Any]:
    """Every (server, protocol) cell ``rounds`` times, servers alternating within a protocol."""
    from bench.triton import baseline

    started = start(frontends, log_dir, profile.device, baseline.wanted(profile) is None)

    def run(client: LoadClient, server: Any, cell: Cell) -> dict[str, Any]:
        return baseline.run_cell_counted(
            client, server, cell, tile_size=224, speed_tps=EXPECTED_RPS, windows=profile.windows
        )

    cells = []
    try:
        for _ in range(rounds):
            for protocol in PROTOCOLS:
                for name, server in started.items():
                    if name == "triton" and protocol not in TRITON_PROTOCOLS:
                        continue
                    result = with_cpu_per_request(
                        run(client, server, Cell(name, protocol, CLIENTS, 1, target=True))
                    )
                    log("  " + _line(result))
                    cells.append(result)
        names = (ONE, frontends_name(frontends))
        crossed = crossing.measure(client, started, names, run, log)
    finally:
        for server in started.values():
            server.stop()
    part: dict[str, Any] = {"frontends": frontends, "clients": CLIENTS, "cells": cells}
    part["crossing"] = crossed
    part["means"] = means(cells)
    part["targets"] = targets(part["means"], frontends) + crossed["ratios"]
    return part


def means(cells: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{server: {protocol: {requests_per_s, cpu_ms_per_request, p99_ms}}}``, means over rounds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key in {(c["server"], c["protocol"]) for c in cells}:
        done = [c for c in cells if (c["server"], c["protocol"]) == key and c.get("requests_per_s")]
        if done:
            out.setdefault(key[0], {})[key[1]] = {
                k: statistics.mean(c[k] for c in done if c.get(k) is not None)
                for k in ("requests_per_s", "cpu_ms_per_request", "p99_ms")
                if any(c.get(k) is not None for c in done)
            }
    return out


def targets(mean: dict[str, Any], frontends: int) -> list[dict[str, Any]]:
    """The issue's ratios, each with its goal and whether it was met (absent cells skipped)."""

    def rate(server: str, protocol: str) -> float | None:
        name = frontends_name(frontends) if server == "N" else server
        return mean.get(name, {}).get(protocol, {}).get("requests_per_s")

    out = []
    for what, num, den, goal in RATE_TARGETS:
        a, b = rate(*num), rate(*den)
        if a and b:
            out.append({"target": what, "ratio": a / b, "goal": goal, "met": a / b >= goal})
    one = mean.get(ONE, {})
    if "v1-jpeg" in one and "v2-json-jpeg" in one:
        ratio = one["v2-json-jpeg"]["cpu_ms_per_request"] / one["v1-jpeg"]["cpu_ms_per_request"]
        out.append({"target": "V2 JSON JPEG CPU per request vs V1's", "ratio": ratio,
                    "goal": 1.0, "met": ratio <= 1.0, "at_most": True})  # fmt: skip
    return out


def _line(c: dict[str, Any]) -> str:
    def n(key: str, digits: int) -> str:
        value = c.get(key)
        return "" if value is None else f"{value:.{digits}f}"

    if "failed" in c:
        return f"| {c['server']} | {c['protocol']} | failed: {c['failed']} | | | | |"
    return (
        f"| {c['server']} | {c['protocol']} | {n('requests_per_s', 0)} "
        f"| {n('cpu_ms_per_request', 2)} | {n('p50_ms', 1)} | {n('p99_ms', 1)} "
        f"| {n('server_cores', 2)} / {n('client_cores', 2)} / {n('other_cores', 2)} |"
    )


def section(part: dict[str, Any] | None) -> list[str]:
    """``results.md`` lines for the stage (empty when it did not run)."""
    if not part:
        return []
    return [
        f"## Null model at each server's defaults: 1 vs {part['frontends']} front ends, "
        f"beside Triton ({part['clients']} single-tile clients)",
        "",
        "| server | protocol | requests/s | CPU ms / request | p50 ms | p99 ms "
        "| cores: server / client / other |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
        *(_line(c) for c in part["cells"]),
        "",
        *crossing.section(part.get("crossing")),
        *target_rows(part["targets"]),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frontends", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("/tmp/histoserve-frontends.json"))
    args = parser.parse_args(argv)
    return run_alone(measure, section, args.out, frontends=args.frontends, rounds=args.rounds)


if __name__ == "__main__":
    raise SystemExit(main())
