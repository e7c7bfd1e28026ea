"""``python -m bench.studies.fairness``: two models on one device, one flooded by 64 clients, the other by 4.

Issue 51's fairness figure. One ``--model_dir`` of two model folders, ``a``
and ``b``, each the demo ``h0-mini`` package (the same package, so a tile
costs either model the same real forward time) with its own
``histoserve.json`` (batches of ``--batch``, one device worker, ``weight``
``--weight-a`` and ``--weight-b``). Two servers of that folder start side by
side, on the CPU device with 2 torch threads each:

* ``scheduler``: today's server: the models share one device scheduler
  (:mod:`predictor.batching.scheduler`), so one batch runs at a time and device
  time goes by weight;
* ``no scheduler``: the same server with ``HISTOSERVE_BENCH_NO_SCHEDULER=1``
  (:data:`predictor.startup.NO_SCHEDULER_ENV`, a benchmark switch): each
  model's batcher runs its batches as a lone model's does, beside the other's,
  and the host's thread scheduler (on a GPU its stream interleaving) shares
  the device. It differs from the ``scheduler`` arm in that alone, so its
  figures are the scheduler's effect; two server processes (what a lab runs
  today) would also differ in front ends and event loops.

For each arm, phases alternate over ``--rounds`` (a machine that slows down
weighs on both): ``b alone`` (``b``'s 4 clients: the demand ``b`` offers, its
device-busy share alone) and ``both`` (``a``'s 64 clients and ``b``'s 4). Every
client sends requests of ``--tiles`` raw-pixel tiles back to back; the clients
run in their own process (niced to ``--client-nice``, so the cores the server
gets are what is measured). Per phase and model: tiles/s, request latency
p50/p99, and device seconds (the model's ``histoserve_forward_seconds`` over
the window; where forwards overlap, without the scheduler, each counts its
own wall time). ``b``'s share is its device seconds over both models'.

Target (issue 51): ``b``'s share at least what it is owed, ``min(weight share,
demand)``: its weight's share of the device, or all it asks for when it asks
less (max-min fairness), within ``TOLERANCE`` (a split exactly as owed
measures a little either side of it). JSON with ``--out`` (the machine and the commit), a
Markdown table on stdout. A few minutes; not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.markdown import table

ARMS = ("scheduler", "no scheduler")
MODELS = ("a", "b")
TOLERANCE = 0.02
"""How far (a share of the device) below what it is owed ``b``'s share may measure and meet the target."""
_FORWARD_SUM = r'^histoserve_forward_seconds_sum\{{model="{model}"\}} (\S+)$'


def _model_dir(root: Path, args: argparse.Namespace) -> Path:
    from harness.packages import copy_package_dir, demo_package

    package = demo_package("h0-mini")
    model_dir = root / "models"
    for name, weight in zip(MODELS, (args.weight_a, args.weight_b), strict=True):
        copy_package_dir(package, model_dir / name)
        settings = {
            "max_batch_size": args.batch,
            "max_latency_ms": 5,
            "max_queue_size": 1024,
            "instances_per_device": 1,
            "weight": weight,
        }
        (model_dir / name / "histoserve.json").write_text(json.dumps(settings))
    return model_dir


def _start(model_dir: Path, log_dir: Path, arm: str) -> Any:
    from bench.servers.launch import bench_env
    from harness.server import free_port, predictor_command, spawn
    from predictor.startup import NO_SCHEDULER_ENV

    ports = (free_port(), free_port())
    args = predictor_command(
        model_dir, ports, "--device", "cpu", "--preprocess_workers", "2",
        "--instances_per_device", "1", "--load_probe", "off", "--drain_timeout_s", "5",
    )  # fmt: skip
    env = {k: v for k, v in bench_env(2).items() if k != NO_SCHEDULER_ENV}
    if arm == "no scheduler":
        env[NO_SCHEDULER_ENV] = "1"
    kind = arm.replace(" ", "-")
    return spawn(args, ports=ports, log_dir=log_dir, model_name="b", env=env, kind=kind)


def _body(tiles: int, seed: int) -> tuple[bytes, dict[str, str]]:
    """A V2 binary request of raw pixels (tritonclient's wire form), its headers."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (tiles, 224, 224, 3), dtype=np.uint8)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "pixels",
                    "shape": list(pixels.shape),
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": pixels.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return header + pixels.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def _clients(base: str, counts: dict[str, int], tiles: int, nice: int, stop: Any, out: Any) -> None:
    """``counts[model]`` threads per model sending requests back to back until ``stop``.

    Runs in its own process at ``nice``; puts ``(model, status, seconds, ended_monotonic)``
    for every request on ``out``, in one list, at the end.
    """
    os.nice(nice)
    sent: list[tuple[str, int, float, float]] = []
    bodies = {model: _body(tiles, seed) for seed, model in enumerate(counts)}

    def send(model: str) -> None:
        content, headers = bodies[model]
        url = f"{base}/v2/models/{model}/infer"
        with httpx.Client(timeout=600, trust_env=False) as client:
            while not stop.is_set():
                started = time.monotonic()
                status = client.post(url, content=content, headers=headers).status_code
                ended = time.monotonic()
                sent.append((model, status, ended - started, ended))

    threads = [
        threading.Thread(target=send, args=(model,), daemon=True)
        for model, n in counts.items()
        for _ in range(n)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    out.put(sent)


def _forward_s(server: Any) -> dict[str, float]:
    text = server.metrics()
    found = {m: re.search(_FORWARD_SUM.format(model=m), text, re.M) for m in MODELS}
    return {m: float(f.group(1)) if f else 0.0 for m, f in found.items()}


def _phase(server: Any, args: argparse.Namespace, arm: str, name: str) -> dict[str, Any]:
    counts = {"a": args.clients_a, "b": args.clients_b} if name == "both" else {"b": args.clients_b}
    context = multiprocessing.get_context("spawn")
    stop, out = context.Event(), context.Queue()
    process = context.Process(
        target=_clients, args=(server.base, counts, args.tiles, args.client_nice, stop, out)
    )
    process.start()
    try:
        time.sleep(args.settle_s)  # every client has sent; the queues are full
        before, started = _forward_s(server), time.monotonic()
        time.sleep(args.phase_s)
        after, ended = _forward_s(server), time.monotonic()
        stop.set()
        sent = out.get(timeout=600)
        process.join(60)
    finally:
        if process.is_alive():
            process.kill()
    wall = ended - started
    row: dict[str, Any] = {"arm": arm, "phase": name, "wall_s": wall}
    for model in MODELS:
        mine = [s for s in sent if s[0] == model and started <= s[3] <= ended]
        ok = [s for s in mine if s[1] == 200]
        row[model] = {
            "requests": len(ok),
            "errors": len(mine) - len(ok),
            "latencies_s": [s[2] for s in ok],
            "tiles_per_s": len(ok) * args.tiles / wall,
            "device_s": after[model] - before[model],
        }
    return row


def measure(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    model_dir = _model_dir(root, args)
    servers = {arm: _start(model_dir, root / "logs", arm) for arm in ARMS}
    phases: list[dict[str, Any]] = []
    try:
        for server in servers.values():
            server.wait_ready()
        shared = {arm: "takes turns on device(s)" in s.log() for arm, s in servers.items()}
        if shared != {"scheduler": True, "no scheduler": False}:
            raise RuntimeError(f"the arms are not what they claim (scheduler joined: {shared})")
        for server in servers.values():  # warm-up: each model's first batches
            for model in MODELS:
                content, headers = _body(args.tiles, 9)
                url = f"{server.base}/v2/models/{model}/infer"
                httpx.post(url, content=content, headers=headers, timeout=600).raise_for_status()
        for r in range(args.rounds):
            for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                for name in ("b alone", "both"):
                    phases.append(_phase(servers[arm], args, arm, name))
                    brief = {m: phases[-1][m]["device_s"] for m in MODELS}
                    print(json.dumps({"arm": arm, "phase": name, "device_s": brief}), flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return _rows(phases, args)


def _p_ms(values: list[float], q: float) -> float | None:
    return round(1000 * float(np.percentile(values, q)), 1) if values else None


def _rows(phases: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    weight_share = args.weight_b / (args.weight_a + args.weight_b)
    rows = []
    for arm in ARMS:
        alone = [p for p in phases if p["arm"] == arm and p["phase"] == "b alone"]
        both = [p for p in phases if p["arm"] == arm and p["phase"] == "both"]
        wall_alone = sum(p["wall_s"] for p in alone)
        demand = sum(p["b"]["device_s"] for p in alone) / wall_alone
        owed = min(weight_share, demand)
        wall = sum(p["wall_s"] for p in both)
        device = {m: sum(p[m]["device_s"] for p in both) for m in MODELS}
        share = device["b"] / (device["a"] + device["b"])
        row: dict[str, Any] = {
            "arm": arm,
            "b_demand_alone": round(demand, 3),
            "b_weight_share": round(weight_share, 3),
            "b_owed_share": round(owed, 3),
            "b_device_share": round(share, 3),
            "b_share_over_owed": round(share / owed, 2),
            "target_met": share >= owed - TOLERANCE,
            "device_s_per_s": round((device["a"] + device["b"]) / wall, 3),
            "b_alone_tiles_per_s": round(
                sum(p["b"]["tiles_per_s"] * p["wall_s"] for p in alone) / wall_alone, 1
            ),
        }
        for model in MODELS:
            latencies = [x for p in both for x in p[model]["latencies_s"]]
            row[model] = {
                "clients": args.clients_a if model == "a" else args.clients_b,
                "weight": args.weight_a if model == "a" else args.weight_b,
                "requests": len(latencies),
                "errors": sum(p[model]["errors"] for p in both),
                "tiles_per_s": round(
                    sum(p[model]["tiles_per_s"] * p["wall_s"] for p in both) / wall, 1
                ),
                "device_s": round(device[model], 2),
                "p50_ms": _p_ms(latencies, 50),
                "p99_ms": _p_ms(latencies, 99),
            }
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = [
        "arm", "b demand alone", "b owed", "b device share", "share / owed",
        "a tiles/s", "b tiles/s", "a p50 / p99 ms", "b p50 / p99 ms", "device s/s",
    ]  # fmt: skip
    body = [
        [
            r["arm"],
            f"{100 * r['b_demand_alone']:.0f} %",
            f"{100 * r['b_owed_share']:.0f} %",
            f"{100 * r['b_device_share']:.0f} %",
            f"{r['b_share_over_owed']:.2f}",
            f"{r['a']['tiles_per_s']:.0f}",
            f"{r['b']['tiles_per_s']:.0f}",
            f"{r['a']['p50_ms']:.0f} / {r['a']['p99_ms']:.0f}",
            f"{r['b']['p50_ms']:.0f} / {r['b']['p99_ms']:.0f}",
            f"{r['device_s_per_s']:.2f}",
        ]
        for r in rows
    ]
    return "\n".join(table(head, body))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.fairness", description=__doc__)
    parser.add_argument("--clients-a", type=int, default=64)
    parser.add_argument("--clients-b", type=int, default=4)
    parser.add_argument("--weight-a", type=float, default=1.0)
    parser.add_argument("--weight-b", type=float, default=1.0)
    parser.add_argument("--tiles", type=int, default=8, help="tiles per request, either model")
    parser.add_argument("--batch", type=int, default=16, help="each model's max_batch_size")
    parser.add_argument("--phase-s", type=float, default=15.0, help="measured seconds per phase")
    parser.add_argument("--settle-s", type=float, default=4.0, help="load before each window")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--client-nice", type=int, default=10, help="the clients' niceness")
    parser.add_argument("--machine", default="", help="what the run ran on, for the record")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = parser.parse_args(argv)
    from bench.servers.before import checkout_commit
    from bench.studies.jpeg_flood import _machine

    machine = _machine()
    if args.machine:
        machine["note"] = args.machine
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="fairness-"))
    try:
        rows = measure(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    record = {
        "made_by": "python -m bench.studies.fairness",
        "commit": checkout_commit(),
        "machine": machine,
        "settings": {**vars(args), "out": None, "package": "demo h0-mini (both models)"},
        "seconds": round(time.monotonic() - started, 1),
        "tolerance": TOLERANCE,
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(markdown(rows))
    print(json.dumps({r["arm"]: r["target_met"] for r in rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
