"""``python -m bench.studies.classes``: interactive latency under a bulk backlog, with classes and without.

One server (the demo ``h0-mini`` package, one device worker so the device's
busy share is the worker's) and one run. Bulk clients keep its queue full
(``--bulk-clients`` threads, each sending requests of ``--bulk-tiles`` tiles
back to back with ``priority`` 2) while one interactive client sends a
request of ``--tiles`` tiles every ``--gap-s``. Phases, in one run:

* ``idle``: the interactive client alone (its idle latency);
* ``with classes``: under the backlog, the interactive client asks for
  priority 1 (it goes ahead of the queued bulk tiles);
* ``without classes``: under the same backlog, it asks for priority 2 (it
  joins the bulk queue: one FIFO, today's behaviour without classes).

The two loaded phases alternate over ``--rounds`` so a machine that slows
down weighs on both. Per phase: the interactive p50/p99 (ms), its p99 over
the idle p99, bulk tiles/s, and the device's busy share (the worker's
``histoserve_forward_seconds`` over the wall time). Target (issue 51): with
classes, p99 at most 2x idle while the device stays at least 90 % busy.
JSON with ``--out``, a Markdown table on stdout. A few minutes; not part of
``make bench``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.markdown import table

SETTINGS = {"max_batch_size": 16, "max_latency_ms": 5.0, "max_queue_size": 1024}
_FORWARD_SUM = re.compile(r'^histoserve_forward_seconds_sum\{model="bench"\} (\S+)$', re.M)


def _start(log_dir: Path) -> Any:
    from bench.servers import launch
    from harness.packages import demo_package

    server = launch.start_histoserve(
        demo_package("h0-mini"),
        model="bench",
        device="cpu",
        workers=2,
        threads=2,
        log_dir=log_dir,
        instances=1,
        **SETTINGS,
    )
    server.wait_ready()
    return server


def _body(tiles: np.ndarray, priority: int) -> tuple[bytes, dict[str, str]]:
    """A V2 binary request of raw pixels (tritonclient's wire form), its headers."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "pixels",
                    "shape": list(tiles.shape),
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": tiles.nbytes},
                }
            ],
            "parameters": {"priority": priority, "binary_data_output": True},
        }
    ).encode()
    return header + tiles.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


class _Bulk(threading.Thread):
    """Sends bulk requests back to back until stopped; counts the tiles answered."""

    def __init__(self, url: str, tiles: int, seed: int) -> None:
        super().__init__(daemon=True)
        rng = np.random.default_rng(seed)
        self.body = _body(rng.integers(0, 256, (tiles, 224, 224, 3), dtype=np.uint8), 2)
        self.url, self.n = url, tiles
        self.done = 0
        self.errors = 0
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        content, headers = self.body
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                answer = client.post(self.url, content=content, headers=headers)
                if answer.status_code == 200:
                    self.done += self.n
                else:
                    self.errors += 1


def _interactive(url: str, tiles: int, priority: int, seconds: float, gap_s: float) -> list[float]:
    """Latencies (ms) of requests sent every ``gap_s`` for ``seconds``."""
    rng = np.random.default_rng(priority)
    content, headers = _body(rng.integers(0, 256, (tiles, 224, 224, 3), dtype=np.uint8), priority)
    latencies = []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=120) as client:
        while time.monotonic() < end:
            started = time.monotonic()
            answer = client.post(url, content=content, headers=headers)
            answer.raise_for_status()
            latencies.append((time.monotonic() - started) * 1000.0)
            time.sleep(max(0.0, gap_s - (time.monotonic() - started)))
    return latencies


def _forward_s(server: Any) -> float:
    found = _FORWARD_SUM.search(server.metrics())
    return float(found.group(1)) if found else 0.0


def _phase(server: Any, args: argparse.Namespace, name: str, priority: int, bulk: list[_Bulk]):
    url = f"{server.base}/v2/models/bench/infer"
    done_before = sum(b.done for b in bulk)
    busy_before, started = _forward_s(server), time.monotonic()
    latencies = _interactive(url, args.tiles, priority, args.phase_s, args.gap_s)
    wall = time.monotonic() - started
    return {
        "phase": name,
        "latencies_ms": latencies,
        "bulk_tiles_per_s": (sum(b.done for b in bulk) - done_before) / wall if bulk else 0.0,
        "device_busy": (_forward_s(server) - busy_before) / wall,
    }


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def measure(args: argparse.Namespace, log_dir: Path) -> list[dict[str, Any]]:
    server = _start(log_dir)
    try:
        url = f"{server.base}/v2/models/bench/infer"
        _interactive(url, args.tiles, 1, 3.0, args.gap_s)  # warm-up
        phases = [_phase(server, args, "idle", 1, [])]
        bulk = [_Bulk(url, args.bulk_tiles, seed) for seed in range(args.bulk_clients)]
        time.sleep(3.0)  # the backlog builds
        for r in range(args.rounds):
            order = [("with classes", 1), ("without classes", 2)]
            for name, priority in order if r % 2 == 0 else order[::-1]:
                phases.append(_phase(server, args, name, priority, bulk))
                print(json.dumps({k: v for k, v in phases[-1].items() if k != "latencies_ms"}))
        for b in bulk:
            b.stop.set()
        for b in bulk:
            b.join(60)
        errors = sum(b.errors for b in bulk)
    finally:
        server.stop()
    return _rows(phases, errors)


def _rows(phases: list[dict[str, Any]], bulk_errors: int) -> list[dict[str, Any]]:
    rows = []
    for name in ("idle", "with classes", "without classes"):
        mine = [p for p in phases if p["phase"] == name]
        latencies = [x for p in mine for x in p["latencies_ms"]]
        rows.append(
            {
                "phase": name,
                "requests": len(latencies),
                "p50_ms": _p(latencies, 50),
                "p99_ms": _p(latencies, 99),
                "bulk_tiles_per_s": statistics.mean(p["bulk_tiles_per_s"] for p in mine),
                "device_busy": statistics.mean(p["device_busy"] for p in mine),
                "bulk_errors": bulk_errors if name != "idle" else 0,
            }
        )
    idle_p99 = rows[0]["p99_ms"]
    for row in rows:
        row["p99_over_idle_p99"] = row["p99_ms"] / idle_p99
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = [
        "phase",
        "requests",
        "p50 ms",
        "p99 ms",
        "p99 / idle p99",
        "bulk tiles/s",
        "device busy",
    ]
    body = [
        [
            r["phase"],
            r["requests"],
            f"{r['p50_ms']:.0f}",
            f"{r['p99_ms']:.0f}",
            f"{r['p99_over_idle_p99']:.2f}",
            f"{r['bulk_tiles_per_s']:.0f}",
            f"{100 * r['device_busy']:.0f} %",
        ]
        for r in rows
    ]
    return "\n".join(table(head, body))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.classes", description=__doc__)
    parser.add_argument("--tiles", type=int, default=4, help="tiles per interactive request")
    parser.add_argument("--gap-s", type=float, default=0.25, help="between interactive requests")
    parser.add_argument("--bulk-clients", type=int, default=3)
    parser.add_argument("--bulk-tiles", type=int, default=32, help="tiles per bulk request")
    parser.add_argument("--phase-s", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the two loaded phases")
    parser.add_argument("--machine", default="", help="what the run ran on, for the record")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="classes-") as tmp:
        rows = measure(args, Path(tmp))
    record = {
        "machine": args.machine or f"{platform.processor() or platform.machine()}",
        "settings": {**SETTINGS, "instances_per_device": 1, **vars(args), "out": None},
        "seconds": round(time.monotonic() - started, 1),
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
