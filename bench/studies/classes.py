"""``python -m bench.studies.classes``: interactive latency under a bulk backlog, with classes and without.

Servers of the demo ``h0-mini`` package (one device worker each, so a
device's busy share is its worker's), one per ``--urgent-wait-ms`` value:
by default the server's own (bulk batches cut to about that much device
time while interactive requests come) and ``0`` (never cut: the rule
before the cut). Bulk clients keep one server's queue full
(``--bulk-clients`` threads, each sending requests of ``--bulk-tiles``
tiles back to back with ``priority`` 2) while one interactive client sends
a request of ``--tiles`` tiles every ``--gap-s``. Phases, every round:

* ``idle``: the interactive client alone (its idle latency);
* ``idle device, CPU shared with a backlog``: the interactive client on the
  second server, whose device is idle, while the first serves the backlog:
  what the backlog's CPU use (its server's and the load generator's) alone
  adds, without any wait for the device;
* ``without classes``: under the backlog, it asks for priority 2 (it joins
  the bulk queue: one FIFO, the behaviour without classes);
* ``with classes``: under the backlog, the interactive client asks for
  priority 1 (it goes ahead of the queued bulk tiles; bulk batches are cut
  while it comes); ``with classes, urgent_wait_ms N``: the same against the
  server run with that value (0: it waits for a whole bulk batch on the
  device).

Rounds alternate the order (the idle phase first, then each server's
backlog with its phases, the servers and phases reversed every other
round), so a machine that slows down weighs on all. Per phase: the
interactive p50/p99 (ms), its p99 over the idle p99 (the idle phases of
every round pooled), bulk tiles/s, the device's busy share (the worker's
``histoserve_forward_seconds`` over the wall time), the interactive class's
queue wait as the server counts it (``histoserve_queue_wait_seconds`` of the
class it asked for: the mean, and the upper bound of the bucket holding its
99th percentile), and who used the two cores: the server, this load
generator (the interactive and bulk clients, one process) and the rest of
the machine. Target (issue 51): with classes, p99 at most 2x idle while the
device stays at least 90 % busy.
JSON with ``--out``, a Markdown table on stdout. A few minutes; not part of
``make bench``.
"""

from __future__ import annotations

import argparse
import json
import math
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

from bench.load.probes import machine_busy_s, own_cpu_s, process_cpu_s
from bench.markdown import table

SETTINGS = {"max_batch_size": 16, "max_latency_ms": 5.0, "max_queue_size": 1024}
_FORWARD_SUM = re.compile(r'^histoserve_forward_seconds_sum\{model="bench"\} (\S+)$', re.M)
_BATCH = r'^histoserve_batch_size_{}\{{model="bench"\}} (\S+)$'
_WAIT = r'^histoserve_queue_wait_seconds_{}\{{model="bench",priority="{}"\}} (\S+)$'
_WAIT_BUCKET = re.compile(
    r'^histoserve_queue_wait_seconds_bucket\{le="([^"]+)",model="bench",priority="(\d+)"\} (\S+)$',
    re.M,
)
Phase = tuple[str, str, int, str | None]
"""A phase: its name, the interactive client's server, its priority, the bulk clients'
server (None: bulk pauses)."""
CONTENDED = "idle device, CPU shared with a backlog"


def servers_and_phases(urgent_wait_ms: list[str]) -> tuple[dict[str, tuple[str, ...]], list[Phase]]:
    """The servers (name: extra flags), one per ``--urgent_wait_ms`` value (``default``: the
    server's own), and the phases: idle, without classes and with classes on the first, with
    classes on each other, and (given two servers) the interactive client on the second's
    idle device while the first serves the backlog: the same CPU contention, no device wait."""
    servers: dict[str, tuple[str, ...]] = {}
    for value in urgent_wait_ms:
        name = "default" if value == "default" else f"urgent_wait_ms {value}"
        servers[name] = () if value == "default" else ("--urgent_wait_ms", value)
    names = list(servers)
    phases: list[Phase] = [("idle", names[0], 1, None)]
    if len(names) > 1:
        phases.append((CONTENDED, names[1], 1, names[0]))
    phases.append(("without classes", names[0], 2, names[0]))
    for name in names:
        label = "with classes" if name == "default" else f"with classes, {name}"
        phases.append((label, name, 1, name))
    return servers, phases


def _start(log_dir: Path, extra: tuple[str, ...]) -> Any:
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
        extra=extra,
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
    """Sends bulk requests back to back to ``url`` (None: pauses) until stopped; counts tiles."""

    def __init__(self, tiles: int, seed: int) -> None:
        super().__init__(daemon=True)
        rng = np.random.default_rng(seed)
        self.body = _body(rng.integers(0, 256, (tiles, 224, 224, 3), dtype=np.uint8), 2)
        self.url: str | None = None
        self.n = tiles
        self.done = 0
        self.errors = 0
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        content, headers = self.body
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                url = self.url
                if url is None:
                    self.stop.wait(0.05)
                    continue
                answer = client.post(url, content=content, headers=headers)
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


def _counters(server: Any, priority: int) -> dict[str, Any]:
    text = server.metrics()
    found = {
        "forward_s": _FORWARD_SUM.search(text),
        "batch_tiles": re.search(_BATCH.format("sum"), text, re.M),
        "batches": re.search(_BATCH.format("count"), text, re.M),
        "wait_s": re.search(_WAIT.format("sum", priority), text, re.M),
        "waits": re.search(_WAIT.format("count", priority), text, re.M),
    }
    out: dict[str, Any] = {k: float(v.group(1)) if v else 0.0 for k, v in found.items()}
    out["buckets"] = {
        float(le): float(n) for le, p, n in _WAIT_BUCKET.findall(text) if int(p) == priority
    }
    out["server_cpu_s"] = process_cpu_s(server.proc.pid) or 0.0
    out["own_cpu_s"] = own_cpu_s()
    out["busy_s"] = machine_busy_s() or 0.0
    out["at"] = time.monotonic()
    return out


def _phase(
    server: Any, args: argparse.Namespace, name: str, priority: int, bulk: list[_Bulk]
) -> dict[str, Any]:
    url = f"{server.base}/v2/models/bench/infer"
    done_before = sum(b.done for b in bulk)
    a = _counters(server, priority)
    latencies = _interactive(url, args.tiles, priority, args.phase_s, args.gap_s)
    b = _counters(server, priority)
    wall = b["at"] - a["at"]
    waits = b["waits"] - a["waits"]
    server_cores = (b["server_cpu_s"] - a["server_cpu_s"]) / wall
    client_cores = (b["own_cpu_s"] - a["own_cpu_s"]) / wall
    busy_cores = (b["busy_s"] - a["busy_s"]) / wall
    return {
        "phase": name,
        "latencies_ms": latencies,
        "queue_wait_buckets": {le: n - a["buckets"].get(le, 0.0) for le, n in b["buckets"].items()},
        "bulk_tiles_per_s": (sum(x.done for x in bulk) - done_before) / wall if bulk else 0.0,
        "device_busy": (b["forward_s"] - a["forward_s"]) / wall,
        "mean_batch": (b["batch_tiles"] - a["batch_tiles"]) / max(1.0, b["batches"] - a["batches"]),
        "queue_wait_ms": 1000.0 * (b["wait_s"] - a["wait_s"]) / waits if waits else 0.0,
        "server_cores": server_cores,
        "client_cores": client_cores,
        "other_cores": max(0.0, busy_cores - server_cores - client_cores),
    }


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _bucket_p99_ms(buckets: dict[float, float]) -> float:
    """The upper bound (ms) of the histogram bucket that holds the 99th percentile."""
    total = buckets.get(math.inf, 0.0)
    for le in sorted(buckets):
        if total and buckets[le] >= 0.99 * total:
            return 1000.0 * le
    return math.nan


def _load(bulk: list[_Bulk], url: str | None, settle_s: float) -> None:
    """Points the bulk clients at ``url`` (None: stops them) and waits for the backlog."""
    for b in bulk:
        b.url = url
    time.sleep(settle_s)


def measure(args: argparse.Namespace, log_dir: Path) -> list[dict[str, Any]]:
    configs, plan = servers_and_phases(args.urgent_wait_ms)
    servers = {}
    try:
        for name, extra in configs.items():
            servers[name] = _start(log_dir / name.replace(" ", "-"), extra)
        urls = {name: f"{s.base}/v2/models/bench/infer" for name, s in servers.items()}
        for url in urls.values():
            _interactive(url, args.tiles, 1, 3.0, args.gap_s)  # warm-up
        bulk = [_Bulk(args.bulk_tiles, seed) for seed in range(args.bulk_clients)]
        phases = []
        for r in range(args.rounds):
            order = list(configs) if r % 2 == 0 else list(configs)[::-1]
            _load(bulk, None, 1.0)
            for name, server_name, priority, bulk_on in plan:
                if bulk_on is None:
                    phases.append(_phase(servers[server_name], args, name, priority, []))
                    phases[-1]["round"] = r
            for target in order:
                mine = [p for p in plan if p[3] == target]
                _load(bulk, urls[target], 3.0)  # the backlog builds
                for name, server_name, priority, _ in mine if r % 2 == 0 else mine[::-1]:
                    phases.append(_phase(servers[server_name], args, name, priority, bulk))
                    phases[-1]["round"] = r
                    shown = {
                        k: v
                        for k, v in phases[-1].items()
                        if not k.endswith(("latencies_ms", "buckets"))
                    }
                    print(json.dumps(shown))
        for b in bulk:
            b.stop.set()
        for b in bulk:
            b.join(60)
        errors = sum(b.errors for b in bulk)
    finally:
        for server in servers.values():
            server.stop()
    return _rows(phases, [p[0] for p in plan], errors)


def _rows(phases: list[dict[str, Any]], names: list[str], bulk_errors: int) -> list[dict[str, Any]]:
    rows = []
    idle_p99 = {p["round"]: _p(p["latencies_ms"], 99) for p in phases if p["phase"] == "idle"}
    means = (
        "bulk_tiles_per_s",
        "device_busy",
        "mean_batch",
        "queue_wait_ms",
        "server_cores",
        "client_cores",
        "other_cores",
    )
    for name in names:
        mine = [p for p in phases if p["phase"] == name]
        latencies = [x for p in mine for x in p["latencies_ms"]]
        buckets: dict[float, float] = {}
        for p in mine:
            for le, n in p["queue_wait_buckets"].items():
                buckets[le] = buckets.get(le, 0.0) + n
        rows.append(
            {
                "phase": name,
                "requests": len(latencies),
                "p50_ms": _p(latencies, 50),
                "p99_ms": _p(latencies, 99),
                "mean_ms": statistics.mean(latencies),
                **{k: statistics.mean(p[k] for p in mine) for k in means},
                "queue_wait_p99_at_most_ms": _bucket_p99_ms(buckets),
                "per_round_p99_ms": [_p(p["latencies_ms"], 99) for p in mine],
                "per_round_p99_over_idle_p99": [
                    _p(p["latencies_ms"], 99) / idle_p99[p["round"]] for p in mine
                ],
                "bulk_errors": bulk_errors if name != "idle" else 0,
            }
        )
    pooled_idle_p99 = rows[0]["p99_ms"]
    for row in rows:
        row["p99_over_idle_p99"] = row["p99_ms"] / pooled_idle_p99
        row["median_round_p99_over_idle_p99"] = statistics.median(
            row["per_round_p99_over_idle_p99"]
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = [
        "phase",
        "requests",
        "p50 / mean / p99 ms",
        "p99 / idle p99: pooled, rounds' median (range)",
        "bulk tiles/s",
        "device busy",
        "mean batch",
        "queue wait: mean / p99 at most, ms",
        "cores: server / load / other",
    ]
    body = [
        [
            r["phase"],
            r["requests"],
            f"{r['p50_ms']:.0f} / {r['mean_ms']:.0f} / {r['p99_ms']:.0f}",
            f"{r['p99_over_idle_p99']:.2f}, {r['median_round_p99_over_idle_p99']:.2f} "
            f"({min(r['per_round_p99_over_idle_p99']):.2f}-"
            f"{max(r['per_round_p99_over_idle_p99']):.2f})",
            f"{r['bulk_tiles_per_s']:.0f}",
            f"{100 * r['device_busy']:.0f} %",
            f"{r['mean_batch']:.1f}",
            f"{r['queue_wait_ms']:.1f} / {r['queue_wait_p99_at_most_ms']:.0f}",
            f"{r['server_cores']:.2f} / {r['client_cores']:.2f} / {r['other_cores']:.2f}",
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
    parser.add_argument("--phase-s", type=float, default=15.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the phases")
    parser.add_argument(
        "--urgent-wait-ms",
        nargs="+",
        default=["default", "0"],
        help="a server per value: default (the server's own), or --urgent_wait_ms's value",
    )
    parser.add_argument("--machine", default="", help="what the run ran on, for the record")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="classes-") as tmp:
        rows = measure(args, Path(tmp))
    record = {
        "machine": args.machine or f"{platform.processor() or platform.machine()}",
        "settings": {
            **SETTINGS,
            "instances_per_device": 1,
            "servers": {k: list(v) for k, v in servers_and_phases(args.urgent_wait_ms)[0].items()},
            **vars(args),
            "out": None,
        },
        "seconds": round(time.monotonic() - started, 1),
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
