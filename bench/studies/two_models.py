"""``python -m bench.studies.two_models``: two models on one histoserve beside one Triton hosting both.

Issue 51's "two models on one server under mixed load, side by side with
Triton". The two packages are the demo ``h0-mini`` encoder (224 px tiles, a
1536-wide embedding, ~3 ms a tile here) and the demo ``tissue-seg`` segmenter
(512 px tiles, a ``uint8`` 512x512 mask, ~15-20 ms a tile): the pairing a lab
puts on one device (``histoserve embed --tissue tissue-seg`` against the
encoder's URL), and a mixed load in every sense: two families, tile sizes,
request sizes (16 x 224 px vs 4 x 512 px: 2.4 MB vs 3.1 MB) and answer sizes
(98 KB of floats vs 1 MB of mask). Both sides do the same work per tile: uint8
in, ``(x/255 - mean)/std`` in float32 over the batch, one forward, and for the
segmenter ``logits > logit(threshold)`` as ``uint8`` (histoserve's
segmentation family's rule; ``bench/triton/server.py``'s ``mask`` output).

* **histoserve**: one server, ``--model_dir`` of two folders (``h0-mini/``,
  ``tissue-seg/``), each with its ``histoserve.json`` (batch bound, fill wait,
  one device worker); the two share the process's device scheduler
  (:mod:`predictor.batching.scheduler`: one batch at a time on the one CPU
  device, device time split by equal weights).
* **Triton**: one ``tritonserver`` 2.51 (``nvidia-pytriton`` 0.7, ``.venv-triton``)
  hosting both modules through ``bench/triton/server.py --models_json``: each
  its own dynamic batcher (the same ``max_batch_size`` and ``max_queue_delay``
  = ``max_latency_ms``) and one instance.

One torch thread per model everywhere (``OMP_NUM_THREADS=1``). First, each
server's answers for both models over V2 binary REST and gRPC are compared with
the in-process forward (:func:`bench.triton.baseline.check_embeddings`); a
mismatch stops the run before anything is timed. Then, per round and protocol
(V2 binary REST ``pixels``, V2 gRPC), a *cell* on one server: both models'
closed-loop clients at once, each model's from its own load generator process
(:mod:`bench.load.generator`, same warm-up and window), histoserve and Triton
back to back, their order alternating between rounds (H, T, then T, H) so a
machine that slows down weighs on both. Per cell and model: tiles/s, p50/p99
request latency, errors, and the model's *busy share* (seconds busy per
second) from the server's own counters: histoserve's forward seconds (its
batches on the device), Triton's compute duration (for a Python backend the
whole execution: the stub, pytriton's proxy and the callable, waits for the
GIL included, so its two models' shares may sum past one); per cell the cores used by the
server, the two clients and everything else on the machine. The in-process
forward of each model at its request's batch (the *limit*, one thread, in
tiles per CPU second) is measured before and after the rounds: each model's
tiles/s over its limit is the cores of model forwards it got, and their sum,
*model work*, is what the server got done, whatever the split between models;
over the cores the server used, it is the share of the server's CPU that went
into forwards (the figure least moved by what the neighbours took).

JSON with ``--out`` (the machine, the commit, every cell and the summary) and
a Markdown table on stdout. A few minutes; not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.markdown import number, table

SERVERS = ("histoserve", "triton")
PROTOCOLS = ("v2-pixels", "v2-grpc")


@dataclass(frozen=True)
class ModelLoad:
    """One model of the mix: its package, how each server batches it, what its clients send."""

    name: str
    output: str  # "embedding" or "mask" (bench/triton/server.py's outputs)
    tile_size: int
    clients: int
    tiles: int
    max_batch_size: int
    max_latency_ms: float = 5.0
    mask_threshold: float | None = None  # a segmenter's, both servers' (None: its spec's)


def mix(args: argparse.Namespace) -> tuple[ModelLoad, ModelLoad]:
    """The two models and their loads, from the flags."""
    return (
        ModelLoad("h0-mini", "embedding", 224, args.clients_a, args.tiles_a, args.batch_a),
        ModelLoad("tissue-seg", "mask", 512, args.clients_b, args.tiles_b, args.batch_b),
    )


# -- the servers -------------------------------------------------------------------------------
def _packages(models: tuple[ModelLoad, ...]) -> dict[str, Path]:
    from harness.packages import demo_package

    return {m.name: demo_package(m.name) for m in models}


def split_threshold(logits: Any) -> float:
    """The mask threshold that splits ``logits`` in half: ``sigmoid(median)``."""
    return 1.0 / (1.0 + math.exp(-float(np.median(np.asarray(logits, np.float64)))))


def with_discriminating_thresholds(
    models: tuple[ModelLoad, ...], packages: Mapping[str, Path]
) -> tuple[ModelLoad, ...]:
    """Each segmenter with the threshold that makes the check's masks half tissue.

    The demo segmenter's random weights put every logit of the check's tiles
    within about [-0.21, -0.10]: at its spec's 0.5 every mask is empty, and a
    mask check that every server passes with empty answers proves nothing.
    Both servers then serve it at this threshold (the work per tile is the same).
    """
    from bench.triton.baseline import package_facts
    from bench.triton.embedding_check import check_tiles, forward

    out = []
    for m in models:
        if m.output == "mask":
            facts = package_facts(packages[m.name])
            raw = forward(
                str(packages[m.name]),
                facts["mean"],
                facts["std"],
                facts["dtype"],
                check_tiles(m.tile_size),
            )
            m = replace(m, mask_threshold=round(split_threshold(raw.float().numpy()), 6))
        out.append(m)
    return tuple(out)


def _start_histoserve(
    models: tuple[ModelLoad, ...], packages: Mapping[str, Path], root: Path
) -> Any:
    from bench.servers.launch import bench_env
    from harness.packages import copy_package_dir
    from harness.server import free_port, predictor_command, spawn
    from predictor.packages.metadata import embedded_spec, read_metadata

    model_dir = root / "models"
    for m in models:
        copy_package_dir(packages[m.name], model_dir / m.name)
        settings: dict[str, Any] = {
            "max_batch_size": m.max_batch_size,
            "max_latency_ms": m.max_latency_ms,
            "max_queue_size": 1024,
            "instances_per_device": 1,
        }
        if m.mask_threshold is not None:  # the package's spec at this threshold
            spec = embedded_spec(read_metadata(packages[m.name]))
            assert spec is not None, packages[m.name]
            spec_file = root / f"{m.name}-spec.json"
            spec_file.write_text(replace(spec, mask_threshold=m.mask_threshold).to_json())
            settings["spec"] = str(spec_file)
        (model_dir / m.name / "histoserve.json").write_text(json.dumps(settings))
    ports = (free_port(), free_port())
    args = predictor_command(
        model_dir,
        ports,
        "--device",
        "cpu",
        "--preprocess_workers",
        "2",
        "--drain_timeout_s",
        "5",
    )
    return spawn(
        args, ports=ports, log_dir=root / "logs", model_name=models[0].name, env=bench_env(1)
    )


def _start_triton(models: tuple[ModelLoad, ...], packages: Mapping[str, Path], root: Path) -> Any:
    from bench.triton.baseline import TritonModel, start_triton_models

    return start_triton_models(
        [
            TritonModel(
                m.name,
                packages[m.name],
                m.output,
                m.max_batch_size,
                m.max_latency_ms,
                mask_threshold=m.mask_threshold,
            )
            for m in models
        ],
        device="cpu",
        threads=1,
        log_dir=root / "logs",
    )


def _ready(server: Any, models: tuple[ModelLoad, ...]) -> None:
    import httpx

    server.wait_ready()
    for m in models:  # every model, not only the one the harness polls
        url = f"{server.base}/v2/models/{m.name}/ready"
        deadline = time.monotonic() + 120
        while httpx.get(url, timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{server.kind}: model {m.name} not ready:\n{server.tail()}")
            time.sleep(0.2)  # polling another process: there is no event to wait on


# -- the device counters -----------------------------------------------------------------------
COUNTERS = {
    "histoserve": ("histoserve_forward_seconds_sum",),
    "triton": (
        "nv_inference_compute_infer_duration_us",
        "nv_inference_exec_count",
        "nv_inference_request_success",
    ),
}
"""The Prometheus counters read per model around a cell: each server's busy seconds."""
_MODEL_LABEL = re.compile(r'model="([^"]+)"')


def read_counters(text: str, names: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """``{model: {counter: value}}`` of the ``names`` in Prometheus text, summed per model."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        found = _MODEL_LABEL.search(line) if name in names else None
        if found:
            mine = out.setdefault(found.group(1), {})
            mine[name] = mine.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def device_seconds(
    kind: str, before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]]
) -> dict[str, float]:
    """Each model's busy seconds between two readings of :data:`COUNTERS`.

    histoserve's forward seconds are per batch (its device time). Triton's compute duration is
    per request, every request of a batch counted with the whole batch's
    time, so it is scaled by batches over requests: exact when the batches of
    the window hold the same number of requests, an estimate otherwise.
    """
    out = {}
    for model, now in after.items():
        then = before.get(model, {})
        delta = {k: v - then.get(k, 0.0) for k, v in now.items()}
        if kind == "histoserve":
            out[model] = delta.get("histoserve_forward_seconds_sum", 0.0)
            continue
        requests = delta.get("nv_inference_request_success", 0.0)
        batches = delta.get("nv_inference_exec_count", 0.0)
        compute_s = 1e-6 * delta.get("nv_inference_compute_infer_duration_us", 0.0)
        out[model] = compute_s * batches / requests if requests else 0.0
    return out


def _counters(kind: str, server: Any) -> dict[str, dict[str, float]]:
    import httpx

    port = getattr(server, "metrics_port", 0) or server.http_port
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return read_counters(text, COUNTERS[kind])


# -- one cell ----------------------------------------------------------------------------------
def _job(server: Any, kind: str, protocol: str, m: ModelLoad, args: argparse.Namespace) -> dict:
    return {
        "protocol": protocol,
        "concurrency": m.clients,
        "tiles": m.tiles,
        "model": m.name,
        "http": server.http_url,
        "grpc": server.grpc_url,
        "tile_size": m.tile_size,
        "warmup_s": args.warmup_s,
        "window_s": args.window_s,
        "drain_s": 30.0,
        "max_requests": 1_000_000,
        "timeout_s": 120.0,
        "server_pid": server.pid,
        "metrics": False,
    }


def run_cell(
    clients: Mapping[str, Any],
    server: Any,
    kind: str,
    protocol: str,
    models: tuple[ModelLoad, ...],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Both models' clients at once on ``server``; per model its load generator's figures."""
    before, started = _counters(kind, server), time.monotonic()
    with ThreadPoolExecutor(len(models)) as pool:
        futures = {
            m.name: pool.submit(clients[m.name].run, _job(server, kind, protocol, m, args))
            for m in models
        }
        results = {name: f.result() for name, f in futures.items()}
    after, wall = _counters(kind, server), time.monotonic() - started
    busy = device_seconds(kind, before, after)
    cell: dict[str, Any] = {"server": kind, "protocol": protocol, "models": {}}
    for m in models:
        r = results[m.name]
        if "failed" in r:
            raise RuntimeError(f"{kind} {protocol} {m.name}: {r['failed']}")
        cell["models"][m.name] = {
            "clients": m.clients,
            "tiles": m.tiles,
            "tiles_per_s": r["throughput"],
            "p50_ms": r["p50_ms"],
            "p99_ms": r["p99_ms"],
            "requests": r["requests"],
            "errors": sum(r["errors"].values()),
            "busy_share": busy.get(m.name, 0.0) / wall,
        }
    first = results[models[0].name]
    clients_cores = sum(results[m.name].get("client_cores", 0.0) for m in models)
    cell["cores"] = {
        "server": first.get("server_cores"),
        "clients": clients_cores,
        "other": max(
            0.0, first.get("machine_cores", 0.0) - first.get("server_cores", 0.0) - clients_cores
        ),
    }
    return cell


# -- the limit ---------------------------------------------------------------------------------
def limits(
    models: tuple[ModelLoad, ...], packages: Mapping[str, Path], seconds: float
) -> dict[str, float]:
    """Each package's in-process tiles per CPU second at its request's batch, one torch
    thread: CPU time, not wall time, so the neighbours' share of the cores while it is
    measured does not lower it (a shared core would make a wall-clock limit too low)."""
    import torch

    from bench.triton.baseline import package_facts

    torch.set_num_threads(1)
    out = {}
    for m in models:
        facts = package_facts(packages[m.name])
        model = torch._inductor.aoti_load_package(str(packages[m.name]))
        x = torch.rand(m.tiles, 3, m.tile_size, m.tile_size).to(getattr(torch, facts["dtype"]))
        with torch.inference_mode():
            model(x)
            n, started = 0, time.thread_time()
            while time.thread_time() - started < seconds:
                model(x)
                n += 1
        out[m.name] = n * m.tiles / (time.thread_time() - started)
        del model
    return out


# -- the summary (pure) ------------------------------------------------------------------------
def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _server_cores(cell: Mapping[str, Any]) -> float:
    return float(cell.get("cores", {}).get("server") or 0.0)


def summarise(cells: list[dict[str, Any]], limit_tps: Mapping[str, float]) -> list[dict[str, Any]]:
    """One row per protocol and model (and a ``model work`` row per protocol) from the cells.

    Each cell is ``{"server", "protocol", "round", "models": {name: {"tiles_per_s",
    "p99_ms", "errors", ...}}}``. Per row: each server's tiles/s (the mean over
    rounds) and p99 (the median of the rounds' p99s), histoserve over Triton for
    both, and the ratio of each round (its H and T cells ran back to back) so
    the spread shows. ``model work`` sums tiles/s over ``limit_tps`` across the
    models: the share of one core's worth of model forwards each server got
    done, whatever its split between the models; that row also gives the cores the
    server and everything else on the machine used (the mean over its cells), and
    the model work per core the server used (``work_per_core``: what its CPU
    bought, the figure least moved by how much of the machine others took).
    """
    rows: list[dict[str, Any]] = []
    for protocol in PROTOCOLS:
        mine = [c for c in cells if c["protocol"] == protocol]
        if not mine:
            continue
        names = list(mine[0]["models"])
        rounds = sorted({c["round"] for c in mine})
        at = {(c["server"], c["round"]): c for c in mine}

        def work(cell: dict[str, Any], names: list[str] = names) -> float:
            return sum(cell["models"][n]["tiles_per_s"] / limit_tps[n] for n in names)

        for name in [*names, "model work"]:
            row: dict[str, Any] = {"protocol": protocol, "model": name}
            for server in SERVERS:
                got = [at[server, r] for r in rounds if (server, r) in at]
                if name == "model work":
                    row[f"{server}_work"] = round(statistics.fmean(work(c) for c in got), 3)
                    per_core = [work(c) / c["cores"]["server"] for c in got if _server_cores(c)]
                    row[f"{server}_work_per_core"] = (
                        round(statistics.fmean(per_core), 3) if per_core else None
                    )
                    for part in ("server", "other"):
                        known = [c["cores"][part] for c in got if c.get("cores", {}).get(part)]
                        row[f"{server}_{part}_cores"] = (
                            round(statistics.fmean(known), 2) if known else None
                        )
                    continue
                figures = [c["models"][name] for c in got]
                row[f"{server}_tiles_per_s"] = round(
                    statistics.fmean(f["tiles_per_s"] for f in figures), 1
                )
                row[f"{server}_p99_ms"] = round(statistics.median(f["p99_ms"] for f in figures), 1)
                row[f"{server}_errors"] = sum(f["errors"] for f in figures)
                row[f"{server}_busy_share"] = round(
                    statistics.fmean(f["busy_share"] for f in figures), 3
                )
            per_round = []
            for r in rounds:
                h, t = at.get(("histoserve", r)), at.get(("triton", r))
                if h and t:
                    per_round.append(
                        _ratio(work(h), work(t))
                        if name == "model work"
                        else _ratio(
                            h["models"][name]["tiles_per_s"], t["models"][name]["tiles_per_s"]
                        )
                    )
            key = "work" if name == "model work" else "tiles_per_s"
            row["throughput_ratio"] = _ratio(row[f"histoserve_{key}"], row[f"triton_{key}"])
            row["throughput_ratio_rounds"] = per_round
            if name == "model work":
                row["work_per_core_ratio"] = _ratio(
                    row["histoserve_work_per_core"], row["triton_work_per_core"]
                )
            else:
                row["p99_ratio"] = _ratio(row["histoserve_p99_ms"], row["triton_p99_ms"])
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The summary as one Markdown table, then each protocol's cores (server, everything else)."""
    head = [
        "protocol", "model", "histoserve tiles/s", "Triton tiles/s", "H/T tiles/s (rounds)",
        "histoserve p99 ms", "Triton p99 ms", "H/T p99", "busy share H / T", "errors H / T",
    ]  # fmt: skip
    body = []
    for r in rows:
        rounds = ", ".join(number(v, 2) for v in r["throughput_ratio_rounds"])
        ratio = f"{number(r['throughput_ratio'], 2)} ({rounds})"
        if r["model"] == "model work":
            body.append(
                [
                    r["protocol"],
                    "model work (cores)",
                    number(r["histoserve_work"], 2),
                    number(r["triton_work"], 2),
                    ratio,
                    "",
                    "",
                    "",
                    "",
                    "",
                ]
            )
            continue
        body.append(
            [
                r["protocol"],
                r["model"],
                number(r["histoserve_tiles_per_s"]),
                number(r["triton_tiles_per_s"]),
                ratio,
                number(r["histoserve_p99_ms"], 0),
                number(r["triton_p99_ms"], 0),
                number(r["p99_ratio"], 2),
                f"{number(r['histoserve_busy_share'], 2)} / {number(r['triton_busy_share'], 2)}",
                f"{r['histoserve_errors']} / {r['triton_errors']}",
            ]
        )
    lines = table(head, body)
    for r in rows:
        if r["model"] == "model work":
            h, t = "histoserve", "triton"
            lines.append(
                f"\n{r['protocol']}: cores used by the server H "
                f"{number(r.get(f'{h}_server_cores'), 2)} / T {number(r.get(f'{t}_server_cores'), 2)}, "
                f"by everything else on the machine H {number(r.get(f'{h}_other_cores'), 2)} "
                f"/ T {number(r.get(f'{t}_other_cores'), 2)}; model work per server core H "
                f"{number(r.get(f'{h}_work_per_core'), 2)} / T {number(r.get(f'{t}_work_per_core'), 2)}"
                f" ({number(r.get('work_per_core_ratio'), 2)})"
            )
    return "\n".join(lines)


# -- the run -----------------------------------------------------------------------------------
def _check(
    servers: Mapping[str, Any], models: tuple[ModelLoad, ...], packages: Mapping[str, Path]
) -> dict:
    from bench.triton.baseline import check_embeddings

    return {
        m.name: check_embeddings(
            packages[m.name],
            servers,
            model=m.name,
            output=m.output,
            mask_threshold=m.mask_threshold,
        )
        for m in models
    }


def _check_failures(check: Mapping[str, Any]) -> list[str]:
    bad = []
    for model, report in check.items():
        if "failed" in report:
            bad.append(f"{model}: {report['failed']}")
            continue
        bad += [
            f"{model} {server} {protocol}: {result}"
            for server, protocols in report.items()
            for protocol, result in protocols.items()
            if not result.get("ok")
        ]
    return bad


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Starts both servers, checks their answers, runs the interleaved cells."""
    from bench.matrix.cells import LoadClient

    models = mix(args)
    packages = _packages(models)
    models = with_discriminating_thresholds(models, packages)
    servers = {
        "histoserve": _start_histoserve(models, packages, root),
        "triton": _start_triton(models, packages, root),
    }
    clients: dict[str, Any] = {}
    try:
        for server in servers.values():
            _ready(server, models)
        check = _check(servers, models, packages)
        bad = _check_failures(check)
        if bad:
            return {"check": check, "failed": f"answers differ from the in-process forward: {bad}"}
        print(json.dumps({"check": "ok"}), flush=True)
        limit_before = limits(models, packages, args.limit_s)
        clients = {m.name: LoadClient() for m in models}
        cells = []
        for rnd in range(args.rounds):
            for protocol in PROTOCOLS:
                order = SERVERS if (rnd + PROTOCOLS.index(protocol)) % 2 == 0 else SERVERS[::-1]
                for kind in order:
                    cell = run_cell(clients, servers[kind], kind, protocol, models, args)
                    cell["round"] = rnd
                    cells.append(cell)
                    brief = {n: round(f["tiles_per_s"], 1) for n, f in cell["models"].items()}
                    print(json.dumps({"round": rnd, "server": kind, "protocol": protocol,
                                      "tiles_per_s": brief, "cores": cell["cores"]}), flush=True)  # fmt: skip
        limit_after = limits(models, packages, args.limit_s)
    finally:
        for client in clients.values():
            client.close()
        for server in servers.values():
            server.stop()
    limit_tps = {n: (limit_before[n] + limit_after[n]) / 2 for n in limit_before}
    return {
        "check": check,
        "limit_tiles_per_s": {"before": limit_before, "after": limit_after, "mean": limit_tps},
        "cells": cells,
        "summary": summarise(cells, limit_tps),
        "models": [asdict(m) for m in models],
    }


UNFAIR = (
    "Against Triton: its Python backend moves every batch across processes (tritonserver -> "
    "stub -> pytriton's proxy -> the callable) and runs the package through torch's loader, "
    "which holds the GIL for the whole forward on the CPU: its two models' callables share one "
    "Python process, so a forward of one stalls the other's batch handling; histoserve runs the "
    "package through its GIL-free runner (`--forward_runner auto`).",
    "Against histoserve: Triton's HTTP/gRPC front ends and batchers are C++ threads outside "
    "any GIL; histoserve parses both models' requests in one Python event loop, and its "
    "device scheduler runs one batch at a time across the models (one CPU device), where "
    "Triton starts both models' batches at once (each its own instance; their forwards then "
    "contend for the GIL and the two cores).",
    "The split between models is each server's policy: histoserve shares device time by "
    "equal weights; Triton runs whatever each instance's batcher hands it. Per-model tiles/s "
    "therefore differ by policy as well as by cost; the *model work* row (tiles/s over each "
    "model's in-process limit, summed) compares what each got done in all.",
    "Same work per tile and the same batching bounds (`max_batch_size`, `max_queue_delay` = "
    "`max_latency_ms`, one instance per model, one torch thread); requests never exceed a "
    "model's `max_batch_size` (Triton refuses those, histoserve splits them).",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.two_models", description=__doc__)
    parser.add_argument("--clients-a", type=int, default=8, help="h0-mini's clients")
    parser.add_argument("--tiles-a", type=int, default=16, help="h0-mini's tiles per request")
    parser.add_argument("--batch-a", type=int, default=32, help="h0-mini's max_batch_size")
    parser.add_argument("--clients-b", type=int, default=4, help="tissue-seg's clients")
    parser.add_argument("--tiles-b", type=int, default=4, help="tissue-seg's tiles per request")
    parser.add_argument("--batch-b", type=int, default=8, help="tissue-seg's max_batch_size")
    parser.add_argument("--warmup-s", type=float, default=4.0)
    parser.add_argument("--window-s", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--limit-s", type=float, default=3.0, help="seconds per limit measurement")
    parser.add_argument("--machine", default="", help="what the run ran on, for the record")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = parser.parse_args(argv)
    from bench.servers.before import checkout_commit
    from bench.studies.jpeg_flood import _machine
    from bench.triton.baseline import available

    if not available():
        parser.error(".venv-triton is missing: `make .venv-triton/.installed` creates it")
    machine = _machine()
    if args.machine:
        machine["note"] = args.machine
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="two-models-"))
    try:
        result = measure(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    record = {
        "made_by": "python -m bench.studies.two_models",
        "commit": checkout_commit(),
        "machine": machine,
        "settings": {
            **vars(args),
            "out": None,
            "triton": "tritonserver 2.51 (nvidia-pytriton 0.7)",
        },
        "seconds": round(time.monotonic() - started, 1),
        "unfair": list(UNFAIR),
        **result,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    if "failed" in result:
        print(result["failed"])
        return 1
    print(markdown(result["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
