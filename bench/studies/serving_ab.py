"""``python -m bench.studies.serving_ab``: this checkout's server against an earlier one, same run.

A change that should not move performance (a refactor) is checked here: the
server at ``--before`` (extracted from history, :mod:`bench.servers.before`;
the same virtual environment, only ``predictor/`` differs) and this
checkout's server run side by side on the same package, with ``make bench``'s
batching settings and the CPU's default two device workers, and the load generator of ``make bench``
(:mod:`bench.load.generator`) drives the serving cells against each in turn:
batched clients, many single-tile clients over REST and gRPC, and one idle
single-tile client (latency). Rounds alternate which server goes first, so a
machine that slows down mid-run weighs on both. Per cell: each server's
median over the rounds and the ratio after/before (tiles/s; p50 latency for
the idle cell), with the rounds' spread as the noise to read it against.

Packages: the null model (:mod:`bench.servers.null_model`: the request path
alone) and the tiny demo ``h0-mini`` (a real, small forward). Results as
JSON (``--out``) and a Markdown table on stdout. Not part of ``make bench``:
about six minutes on the 2-core development machine (``--packages null``
alone: half that). ``--trace-after`` turns this checkout's server's
OpenTelemetry traces on (every request, ``--otel_sample_ratio 1``) to a
loopback OTLP receiver in this process (:mod:`harness.otlp`, decoding what
it gets as a collector would, on the same CPUs): with ``--before`` this
checkout's own commit, the ratio is what tracing costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.markdown import table
from bench.matrix.cells import Cell, LoadClient, run_cell
from bench.profiles import Windows
from bench.servers.before import checkout_commit

BEFORE = "f3c29a6"
"""``main`` before the model became a composition of parts (the mixin stack)."""

CELLS = (
    ("batched", "v2-pixels", 16, 32),
    ("single-tile REST", "v2-pixels", 64, 1),
    ("single-tile gRPC", "v2-grpc", 64, 1),
    ("idle", "v2-pixels", 1, 1),
)
WINDOWS = Windows(
    warmup_min_s=1.0,
    warmup_max_s=2.0,
    window_min_s=4.0,
    window_max_s=6.0,
    target_min_s=4.0,
    target_max_s=6.0,
)
EXPECTED_TPS = {"null": 500.0, "demo": 300.0}  # sizes the windows only


def _packages() -> dict[str, Path]:
    from harness.packages import demo_package, module_package

    return {
        "null": module_package("h0-mini", "bench.servers.null_model:build"),
        "demo": demo_package("h0-mini"),
    }


def _start(
    package: Path, before: str, log_dir: Path, after_flags: tuple[str, ...] = ()
) -> dict[str, Any]:
    from bench.servers import launch
    from bench.servers.before import source_tree

    settings = {
        "model": "bench",
        "device": "cpu",
        "max_batch_size": 32,
        "max_latency_ms": 5.0,
        "max_queue_size": 1024,
        "workers": 2,
        "threads": 2,
        "log_dir": log_dir,
        "instances": 2,  # the CPU default (`auto`), passed to both servers alike
    }
    started = {
        "after": launch.start_histoserve(package, kind="histoserve", extra=after_flags, **settings),
        "before": launch.start_histoserve(
            package, kind="histoserve-before", source=source_tree(before), **settings
        ),
    }
    launch.wait_all_ready(started)
    return started


def _figure(label: str, result: dict[str, Any]) -> float | None:
    if "failed" in result or result.get("errors"):
        return None
    return result.get("p50_ms") if label == "idle" else result.get("throughput")


def measure(
    before: str,
    rounds: int,
    log_dir: Path,
    packages: tuple[str, ...] = ("null", "demo"),
    after_flags: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """One row per package and cell: each server's figures per round, medians and the ratio."""
    rows = []
    client = LoadClient()
    try:
        for package_label, package in _packages().items():
            if package_label not in packages:
                continue
            servers = _start(package, before, log_dir, after_flags)
            try:
                for label, protocol, clients, tiles in CELLS:
                    figures: dict[str, list[float | None]] = {"after": [], "before": []}
                    for r in range(rounds):
                        order = ("after", "before") if r % 2 == 0 else ("before", "after")
                        for name in order:
                            cell = Cell(name, protocol, clients, tiles, target=True)
                            result = run_cell(
                                client,
                                servers[name],
                                cell,
                                tile_size=224,
                                speed_tps=EXPECTED_TPS[package_label],
                                windows=WINDOWS,
                            )
                            figures[name].append(_figure(label, result))
                    rows.append(_row(package_label, label, protocol, clients, tiles, figures))
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                for server in servers.values():
                    server.stop()
    finally:
        client.close()
    return rows


def _row(
    package: str,
    label: str,
    protocol: str,
    clients: int,
    tiles: int,
    figures: dict[str, list[float | None]],
) -> dict[str, Any]:
    good = {name: [f for f in values if f is not None] for name, values in figures.items()}
    median = {name: statistics.median(v) if v else None for name, v in good.items()}
    ratio = (
        median["after"] / median["before"]
        if median["after"] is not None and median["before"]
        else None
    )
    return {
        "package": package,
        "cell": label,
        "protocol": protocol,
        "clients": clients,
        "tiles": tiles,
        "unit": "p50 ms" if label == "idle" else "tiles/s",
        "rounds": figures,
        "median": median,
        "after_over_before": ratio,
        "failed_rounds": {n: len(v) - len(good[n]) for n, v in figures.items()},
    }


def markdown(rows: list[dict[str, Any]], before: str) -> str:
    """The table ``docs/performance.md`` quotes."""

    def spread(values: list[float | None]) -> str:
        good = [v for v in values if v is not None]
        return f"{min(good):.1f}-{max(good):.1f}" if good else "failed"

    body = [
        [
            r["package"],
            f"{r['cell']} ({r['protocol']}, {r['clients']}x{r['tiles']})",
            r["unit"],
            spread(r["rounds"]["before"]),
            spread(r["rounds"]["after"]),
            f"{r['after_over_before']:.2f}" if r["after_over_before"] is not None else "n/a",
        ]
        for r in rows
    ]
    head = ["package", "cell", "unit", f"before ({before})", "after", "after / before (medians)"]
    return "\n".join(table(head, body))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.serving_ab", description=__doc__)
    parser.add_argument("--before", default=BEFORE, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per cell and server")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    parser.add_argument(
        "--packages", default="null,demo", help="which packages, comma-separated: null, demo"
    )
    parser.add_argument(
        "--trace-after",
        action="store_true",
        help="this checkout's server traces every request to a loopback OTLP receiver",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    packages = tuple(args.packages.split(","))
    receiver = None
    after_flags: tuple[str, ...] = ()
    if args.trace_after:
        from harness.otlp import OtlpReceiver

        receiver = OtlpReceiver(keep=False)
        after_flags = ("--otel_endpoint", receiver.url, "--otel_sample_ratio", "1")
    try:
        with tempfile.TemporaryDirectory(prefix="serving-ab-") as tmp:
            rows = measure(args.before, args.rounds, Path(tmp), packages, after_flags)
    finally:
        if receiver is not None:
            receiver.close()
    record = {
        "before": args.before,
        "after": checkout_commit(),
        "after_flags": list(after_flags),
        "spans_received": receiver.received if receiver is not None else None,
        "rounds": args.rounds,
        "device": "cpu",
        "seconds": round(time.monotonic() - started, 1),
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(markdown(rows, args.before))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
