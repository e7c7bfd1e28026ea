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

The flooders run in their own process (16 threads), at ``--flood_nice``
(default 10: below the server and the ordinary client, so what is measured
is the server's share, not the sending clients' on the same cores; 0 to
give them equal priority). Over the flooded rounds the CPU seconds of the
server's event-loop thread, the server's other threads, the flooders'
process, this process and the whole machine are read from ``/proc`` and
reported with the refusals answered in that window: the event loop's CPU
per refusal is the cost of one refused request.

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


def _flood_process(
    url: str,
    body: bytes,
    headers: dict[str, str],
    backoff: str,
    nice: int,
    stop: Any,
    out: Any,
) -> None:
    """The flood: ``FLOODERS`` threads sending ``body`` back to back until ``stop`` is set.

    Runs in its own process at ``nice``; puts ``(status, seconds, ended_monotonic)``
    for every request on ``out``, in one list, at the end.
    """
    import httpx

    os.nice(nice)
    sent: list[tuple[int, float, float]] = []

    def flood() -> None:
        with httpx.Client(timeout=600, trust_env=False) as client:
            while not stop.is_set():
                started = time.perf_counter()
                reply = client.post(url, content=body, headers=headers)
                seconds = time.perf_counter() - started
                sent.append((reply.status_code, seconds, time.monotonic()))
                retry_after = reply.headers.get("retry-after")
                if reply.status_code == 503 and backoff == "retry-after" and retry_after:
                    stop.wait(float(retry_after))

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(FLOODERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    out.put(sent)


def _cpu_s(pid: int, tid: int | None = None) -> float:
    """CPU seconds (user + system) of a process, or of one of its threads."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy (not idle or waiting on I/O)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def _cpu_snapshot(server_pid: int, flood_pid: int) -> dict[str, float]:
    server = _cpu_s(server_pid)
    loop = _cpu_s(server_pid, server_pid)  # the main thread runs the event loop
    return {
        "server_event_loop": loop,
        "server_other_threads": server - loop,
        "flooders": _cpu_s(flood_pid),
        "bench_ordinary_client": _cpu_s(os.getpid()),
        "machine_busy": _machine_busy_s(),
        "wall": time.monotonic(),
    }


def _cpu_use(before: dict[str, float], after: dict[str, float], refusals: int) -> dict[str, Any]:
    """Cores each part used over the window, and the event loop's CPU per refusal."""
    wall = after["wall"] - before["wall"]
    cores = {k: round((after[k] - before[k]) / wall, 3) for k in before if k != "wall"}
    loop_s = after["server_event_loop"] - before["server_event_loop"]
    return {
        "window_s": round(wall, 1),
        "cores_used": cores,
        "refusals_in_window": refusals,
        "refusals_per_s": round(refusals / wall, 1),
        "event_loop_cpu_ms_per_refusal": round(1000 * loop_s / refusals, 2) if refusals else None,
        "flooders_cpu_ms_per_request": (
            round(1000 * (after["flooders"] - before["flooders"]) / refusals, 2)
            if refusals
            else None
        ),
    }


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
    source: Path | None, version: str, log_dir: Path, rounds: int, backoff: str, nice: int = 10
) -> dict[str, Any]:
    """Idle latencies, then latencies under the flood, on one fresh server."""
    import multiprocessing

    import httpx

    from bench.servers.launch import start_histoserve
    from bench.studies.request_cost import resized_at_budget
    from harness.packages import demo_package
    from histoserve import wire

    package = demo_package("h0-mini")
    server = start_histoserve(
        package, model="h0-mini", device="cpu", max_batch_size=32, max_latency_ms=5,
        max_queue_size=1024, workers=2, threads=2, instances=2, log_dir=log_dir,
        source=source, kind=f"jpeg-flood-{version}",
    )  # fmt: skip
    url = f"{server.base}/v2/models/h0-mini/infer"
    attack_inputs = resized_at_budget()
    attack = _sender(url, attack_inputs)
    body, headers = wire.encode_request(attack_inputs, parameters={"mode": "embedding"})
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    out = context.Queue()
    flooder = context.Process(
        target=_flood_process, args=(url, body, dict(headers), backoff, nice, stop, out)
    )
    attacks: list[tuple[int, float, float]] = []
    try:
        server.wait_ready()
        with httpx.Client(timeout=600, trust_env=False) as client:
            senders = _ordinary(url)
            _latencies(client, senders, 3)  # warm-up
            idle = _latencies(client, senders, rounds)
            attack(client)  # one alone: the flood's first answers are not the warm-up's
            flooder.start()
            time.sleep(3.0)  # every flooder has sent
            before = _cpu_snapshot(server.proc.pid, flooder.pid)
            flooded = _latencies(client, senders, rounds)
            after = _cpu_snapshot(server.proc.pid, flooder.pid)
            stop.set()
            attacks = out.get(timeout=600)
            flooder.join(60)
    finally:
        if flooder.is_alive():
            flooder.kill()
        server.stop()
    in_window = sum(
        1 for code, _, ended in attacks if code == 503 and before["wall"] <= ended <= after["wall"]
    )
    cpu = _cpu_use(before, after, in_window)
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
    ok = [s for code, s, _ in attacks if code == 200]
    refused = [s for code, s, _ in attacks if code == 503]
    return {
        "server": version,
        "backoff": backoff,
        "flood_nice": nice,
        "cpu_while_flooded": cpu,
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
    parser.add_argument(
        "--flood_nice", type=int, default=10, help="the flooders' process's niceness (0: equal)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    machine = _machine()
    runs = []
    with tempfile.TemporaryDirectory(prefix="jpeg-flood-") as tmp:
        if args.before:
            from bench.servers.before import source_tree

            source = source_tree(args.before)
            runs.append(
                measure(
                    source, args.before, Path(tmp), args.before_rounds, args.backoff,
                    args.flood_nice,
                )
            )  # fmt: skip
            print(json.dumps(runs[-1]), flush=True)
        runs.append(
            measure(None, "this checkout", Path(tmp), args.rounds, args.backoff, args.flood_nice)
        )
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
        print(f"{run['server']}: cpu {run['cpu_while_flooded']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
