"""``python -m bench.studies.load_probe_cost``: what ``--load_probe auto`` costs a start on the CPU.

The first start of a package on a host probes it: a fresh child process
imports torch, loads the package and runs one batch
(:mod:`predictor.runtime.load_probe`). A restart finds the package in the host's
record (:mod:`predictor.packages.probe_record`) and pays only the lookup. Both are
timed here, rounds interleaved, on the cached tiny ``h0-mini`` demo package;
written to ``bench/results/load_probe_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from harness.packages import demo_package
from harness.server import REPO
from predictor.packages.digest import sha256_file
from predictor.packages.metadata import read_metadata
from predictor.packages.probe_record import ProbeRecord, probe_id
from predictor.runtime.load_probe import probe_load

RESULT = REPO / "bench" / "results" / "load_probe_cost.json"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.load_probe_cost")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    package = demo_package("h0-mini")
    metadata = read_metadata(package)
    identity = probe_id(sha256_file(package), "cpu", "auto")
    probes, lookups = [], []
    with tempfile.TemporaryDirectory() as folder:
        record = ProbeRecord.open(Path(folder))
        for _ in range(args.rounds):
            report = probe_load(package, "cpu", metadata, runner="auto", timeout_s=300)
            probes.append(report.seconds)
            record.remember(identity, package)
            start = time.perf_counter()
            assert ProbeRecord.open(Path(folder)).passed(identity)
            lookups.append(time.perf_counter() - start)
    result = {
        "package": f"h0-mini tiny demo ({package.stat().st_size:,} bytes)",
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), CPU only",
        "rounds": args.rounds,
        "first_start_probe_s": {
            "median": round(statistics.median(probes), 2),
            "min": round(min(probes), 2),
            "max": round(max(probes), 2),
        },
        "restart_record_lookup_ms": round(statistics.median(lookups) * 1000, 3),
    }
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
