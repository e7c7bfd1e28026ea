"""``python -m bench.studies.jpeg_flood``: an ordinary request's latency while costly jpeg requests flood the server.

Issue 53, case 5. 16 clients send, back to back, the largest jpeg request
``--max_request_pixels`` allows to resize (2 x 2 slide tiles of 4,096 px,
4 boxes of 4,096 px across their corners: 4 tiles, about a second of CPU
each; :func:`bench.studies.request_cost.resized_at_budget`), while one
ordinary client sends its requests one after the other: 8 raw ``pixels``
tiles, and what ``histoserve embed`` sends for 16 model tiles read at the
model's mpp (16 boxes of 224 px over 256 px slide tiles of real texture).
Each ordinary request's latency is measured idle, then under the flood, on
the same server; the ratio is the figure (ratios only: the machine is
shared). With ``--before COMMIT`` the server at that commit is measured the
same way first (only ``predictor/`` differs, :mod:`bench.servers.before`).

The flood's clients honour ``Retry-After`` (``--backoff retry-after``, the
default, as ``histoserve``'s own client does) or resend at once (``none``:
a client that ignores it, whose refusals then cost the server's event loop
their parsing). Every server runs at the defaults of a 2-core CPU host
(batches of 32, 5 ms, a 1,024-tile queue, 2 stage-1 threads, 2 instances).

Results as JSON (``--out``, with the machine's description) and a Markdown
table on stdout: the figures ``docs/reliability.md`` quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.markdown import table

FLOODERS = 16
Send = Callable[[], tuple[int, float]]


def _machine() -> dict[str, Any]:
    """What the figures were measured on: CPU model, cores, memory, load when started."""
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "python": platform.python_version(),
        "device": "cpu",
        "note": "development machine: its cores are shared with other engineers' work",
    }


def _sender(url: str, inputs: dict[str, np.ndarray]) -> Callable[[Any], tuple[int, float, str]]:
    """``send(client)``: the request's status, its wall seconds and its ``Retry-After``."""
    from histoserve import wire

    body, headers = wire.encode_request(inputs, parameters={"mode": "embedding"})

    def send(client: Any) -> tuple[int, float, str]:
        started = time.perf_counter()
        reply = client.post(url, content=body, headers=headers)
        return reply.status_code, time.perf_counter() - started, reply.headers.get("retry-after")

    return send


def _ordinary(url: str) -> dict[str, Callable[[Any], tuple[int, float, str]]]:
    from bench.load.payloads import slide_jpeg_inputs

    rng = np.random.default_rng(53)
    pixels = rng.integers(0, 256, (8, 224, 224, 3), dtype=np.uint8)
    return {
        "8 raw pixel tiles": _sender(url, {"pixels": pixels}),
        "16 jpeg boxes of 224 px": _sender(url, slide_jpeg_inputs(16, 224)),
    }


def _latencies(
    client: Any, senders: dict[str, Callable[[Any], tuple[int, float, str]]], rounds: int
) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {name: [] for name in senders}
    for _ in range(rounds):
        for name, send in senders.items():
            status, seconds, _ = send(client)
            out[name].append((status, seconds))
    return out


def measure(
    source: Path | None, version: str, log_dir: Path, rounds: int, backoff: str
) -> dict[str, Any]:
    """Idle latencies, then latencies under the flood, on one fresh server."""
    import httpx

    from bench.servers.launch import start_histoserve
    from bench.studies.request_cost import resized_at_budget
    from harness.packages import demo_package

    package = demo_package("h0-mini")
    server = start_histoserve(
        package, model="h0-mini", device="cpu", max_batch_size=32, max_latency_ms=5,
        max_queue_size=1024, workers=2, threads=2, instances=2, log_dir=log_dir,
        source=source, kind=f"jpeg-flood-{version}",
    )  # fmt: skip
    url = f"{server.base}/v2/models/h0-mini/infer"
    attack = _sender(url, resized_at_budget())
    stop = threading.Event()
    attacks: list[tuple[int, float]] = []

    def flood() -> None:
        with httpx.Client(timeout=600, trust_env=False) as client:
            while not stop.is_set():
                status, seconds, retry_after = attack(client)
                attacks.append((status, seconds))
                if status == 503 and backoff == "retry-after" and retry_after:
                    stop.wait(float(retry_after))

    try:
        server.wait_ready()
        with httpx.Client(timeout=600, trust_env=False) as client:
            senders = _ordinary(url)
            _latencies(client, senders, 3)  # warm-up
            idle = _latencies(client, senders, rounds)
            attack(client)  # one alone: the flood's first answers are not the warm-up's
            threads = [threading.Thread(target=flood, daemon=True) for _ in range(FLOODERS)]
            for thread in threads:
                thread.start()
            time.sleep(3.0)  # every flooder has sent
            flooded = _latencies(client, senders, rounds)
            stop.set()
            for thread in threads:
                thread.join(600)
    finally:
        server.stop()
    rows = []
    for name in idle:
        base = [s for code, s in idle[name] if code == 200]
        under = [s for code, s in flooded[name] if code == 200]
        rows.append(
            {"server": version, "request": name, "rounds": rounds,
             "idle_ok": len(base), "idle_p50_s": _p(base, 50), "idle_p90_s": _p(base, 90),
             "flood_ok": len(under), "flood_refused": sum(c == 503 for c, _ in flooded[name]),
             "flood_p50_s": _p(under, 50), "flood_p90_s": _p(under, 90),
             "p50_ratio": _ratio(_p(under, 50), _p(base, 50)),
             "p90_ratio": _ratio(_p(under, 90), _p(base, 90))}
        )  # fmt: skip
    ok = [s for code, s in attacks if code == 200]
    refused = [s for code, s in attacks if code == 503]
    return {
        "server": version,
        "backoff": backoff,
        "ordinary": rows,
        "flood": {
            "sent": len(attacks),
            "ok": len(ok),
            "refused_503": len(refused),
            "other": len(attacks) - len(ok) - len(refused),
            "ok_p50_s": _p(ok, 50),
            "refused_p50_s": _p(refused, 50),
        },
    }


def _p(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None, help="also measure this commit's server first")
    parser.add_argument("--rounds", type=int, default=15, help="ordinary requests of each kind")
    parser.add_argument("--before_rounds", type=int, default=4, help="the same, --before's")
    parser.add_argument("--backoff", choices=("retry-after", "none"), default="retry-after")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    machine = _machine()
    runs = []
    with tempfile.TemporaryDirectory(prefix="jpeg-flood-") as tmp:
        if args.before:
            from bench.servers.before import source_tree

            source = source_tree(args.before)
            runs.append(measure(source, args.before, Path(tmp), args.before_rounds, args.backoff))
            print(json.dumps(runs[-1]), flush=True)
        runs.append(measure(None, "this checkout", Path(tmp), args.rounds, args.backoff))
        print(json.dumps(runs[-1]), flush=True)
    if args.out:
        from bench.servers.before import checkout_commit

        made = {
            "made_by": "python -m bench.studies.jpeg_flood",
            "before": args.before,
            "commit": checkout_commit(),
            "machine": machine,
        }
        args.out.write_text(json.dumps({**made, "runs": runs}, indent=1) + "\n")
    head = ["server", "request", "idle p50 s", "flood p50 s", "p50 ratio", "p90 ratio", "refused"]
    cells = [
        [r["server"], r["request"], r["idle_p50_s"], r["flood_p50_s"], r["p50_ratio"],
         r["p90_ratio"], r["flood_refused"]]
        for run in runs for r in run["ordinary"]
    ]  # fmt: skip
    print("\n".join(table(head, cells)))
    for run in runs:
        print(f"{run['server']}: flood {run['flood']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
