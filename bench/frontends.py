"""One front end against several (``--frontends``) on the null model, side by side in one run.

``python -m bench.frontends [--frontends 2] [--rounds 2] [--out FILE.json]``:
two histoserve servers on :mod:`bench.null_model` (a forward of tens of
microseconds, so the request path is what is measured), one with
``--frontends 1`` and one with ``--frontends N``, each given 64 single-tile
clients over V2 binary REST and V2 gRPC in turn (alternating, ``--rounds``
times): requests per second, server CPU per request (the whole process tree:
owner and front ends) and the cores the load client and everything else on
the machine used meanwhile. Prints a Markdown table; not a timed test.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.cells import Cell, LoadClient, run_cell
from bench.config import Profile

PROTOCOLS = ("v2-pixels", "v2-grpc")
CLIENTS = 64
EXPECTED_RPS = 500.0  # sizes the windows only


def _servers(counts: tuple[int, ...], log_dir: Path, profile: Profile) -> dict[int, Any]:
    from bench import servers
    from harness.packages import module_package

    package = module_package("h0-mini", "bench.null_model:build")
    started = {
        n: servers.start_histoserve(
            package,
            model="bench",
            device="cpu",
            max_batch_size=32,
            max_latency_ms=5.0,
            max_queue_size=profile.max_queue_size,
            workers=profile.preprocess_workers,
            threads=profile.threads,
            log_dir=log_dir,
            kind=f"histoserve-frontends{n}",
            frontends=n,
        )
        for n in counts
    }
    servers.wait_all_ready({str(n): s for n, s in started.items()})
    return started


def measure(frontends: int, rounds: int, log_dir: Path) -> list[dict[str, Any]]:
    """Every (protocol, front ends) cell ``rounds`` times, alternating the servers."""
    profile = Profile(name="frontends", models=())
    started = _servers((1, frontends), log_dir, profile)
    client = LoadClient()
    cells = []
    try:
        for _ in range(rounds):
            for protocol in PROTOCOLS:
                for n, server in started.items():
                    cell = Cell("histoserve", protocol, CLIENTS, 1, target=True)
                    result = run_cell(
                        client, server, cell, tile_size=224, speed_tps=EXPECTED_RPS,
                        windows=profile.windows,
                    )  # fmt: skip
                    result["frontends"] = n
                    rps, cores = result.get("requests_per_s"), result.get("server_cores")
                    if rps and cores is not None:
                        result["cpu_ms_per_request"] = 1000.0 * cores / rps
                    print(_line(result), flush=True)
                    cells.append(result)
    finally:
        client.close()
        for server in started.values():
            server.stop()
    return cells


def _line(c: dict[str, Any]) -> str:
    def n(key: str, digits: int) -> str:
        value = c.get(key)
        return "" if value is None else f"{value:.{digits}f}"

    return (
        f"| {c['protocol']} | {c['frontends']} | {n('requests_per_s', 0)} "
        f"| {n('cpu_ms_per_request', 2)} | {n('p50_ms', 1)} | {n('p99_ms', 1)} "
        f"| {n('server_cores', 2)} / {n('client_cores', 2)} / {n('other_cores', 2)} |"
    )


def summary(cells: list[dict[str, Any]], frontends: int) -> list[str]:
    """Markdown: mean requests/s per (protocol, front ends) and the ratio N : 1."""
    lines = ["| protocol | requests/s, 1 front end | requests/s, N | N : 1 |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for protocol in PROTOCOLS:
        mean = {
            n: statistics.mean(
                c["requests_per_s"]
                for c in cells
                if c["protocol"] == protocol and c["frontends"] == n and c.get("requests_per_s")
            )
            for n in (1, frontends)
        }
        ratio = mean[frontends] / mean[1]
        lines.append(f"| {protocol} | {mean[1]:.0f} | {mean[frontends]:.0f} | {ratio:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frontends", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("/tmp/histoserve-frontends.json"))
    args = parser.parse_args(argv)
    print("| protocol | front ends | requests/s | CPU ms / request | p50 ms | p99 ms "
          "| cores: server / client / other |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    cells = measure(args.frontends, args.rounds, args.out.parent / "frontends-logs")
    print("\n".join(["", *summary(cells, args.frontends)]))
    args.out.write_text(json.dumps(cells, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
