"""The Triton baseline: start it, check its answers, run its cells beside histoserve's.

NVIDIA Triton 2.51 comes from the ``nvidia-pytriton`` 0.7 wheel, which pins
``numpy<2``; it lives in its own venv, ``.venv-triton`` (``make bench``
creates it), and :mod:`bench.triton.server` runs there. This module is the
orchestrator's side:

- :func:`start_triton` starts it on free loopback ports with the same
  batching settings as histoserve (dynamic batcher, ``max_batch_size`` tiles,
  ``max_queue_delay`` = ``max_latency_ms``) and the same thread count, with
  the interpreter's own ``libpython`` first on ``LD_LIBRARY_PATH`` (else the
  Python backend's stub finds the system's and model load fails with
  ``'_thread.RLock' object has no attribute '_recursion_count'``);
- :func:`check_embeddings` compares served embeddings (histoserve's and
  Triton's, REST and gRPC) with the in-process forward before anything is
  timed (:mod:`bench.triton.embedding_check`, run in the Triton venv);
- :func:`compare` runs each (clients, tiles, protocol) cell on histoserve and
  on Triton back to back, so each ratio comes from one stretch of time.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import httpx

from bench.matrix.cells import Cell, LoadClient, run_cell
from bench.profiles import ModelCase, Profile
from bench.servers.launch import bench_env
from harness.server import REPO, Server, free_port, spawn

VENV = REPO / ".venv-triton"
SCRIPTS = Path(__file__).resolve().parent
"""Where :mod:`bench.triton.server` and :mod:`bench.triton.embedding_check` are, run by path in ``VENV``."""
PROTOCOLS = ("v2-pixels", "v2-grpc")
COSINE_OK = 0.999  # bf16 packages: the two normalisations may round an input differently
MASK_AGREE_OK = 0.999
"""A segmenter's served mask against the in-process one: the share of pixels that must agree
(a logit within rounding of the threshold may fall either side)."""

UNFAIR = (
    "Against Triton: its Python backend moves every batch across processes "
    "(tritonserver -> python-backend stub -> pytriton's proxy -> the callable, through "
    "shared memory and ZeroMQ), a cost histoserve does not pay; Triton's own C++ backends "
    "cannot load an AOTInductor `.pt2`.",
    "Against histoserve: Triton's HTTP and gRPC front ends and its batcher are multi-threaded "
    "C++ outside the GIL; histoserve parses requests and batches in one Python event loop.",
    "Batching differs: Triton's dynamic batcher holds a request up to `max_queue_delay` "
    "(= histoserve's `max_latency_ms`) to fill a batch even when its instance is idle; "
    "histoserve dispatches a lone request to an idle worker at once.",
    "Same work per tile: the same package and dtype, uint8 in, `(x/255-mean)/std` on the "
    "CPU in float32 over the whole batch, one torch thread per process (Triton's server "
    "threads are its own). Triton refuses requests over `max_batch_size` tiles (histoserve "
    "splits them); no cell here sends more.",
    "CPU use: Triton's *server* cores are its whole process tree (pytriton, tritonserver, "
    "stub); its mean batch comes from its own metrics over the cell including warm-up.",
)


@dataclass
class TritonServer(Server):
    """A :class:`harness.server.Server` that also has Triton's metrics port."""

    metrics_port: int = 0


def available() -> bool:
    """True when the Triton venv is installed (``make bench`` creates it)."""
    return (VENV / "bin" / "python").is_file()


@functools.cache
def _libdir() -> str:
    """The Triton venv interpreter's ``LIBDIR`` (where its ``libpython3.x.so`` is)."""
    code = "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"
    return subprocess.check_output([str(VENV / "bin" / "python"), "-c", code], text=True).strip()


def _env(threads: int) -> dict[str, str]:
    env = bench_env(threads)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (_libdir(), env.get("LD_LIBRARY_PATH", "")) if p
    )
    return env


def package_facts(package: Path) -> dict[str, str]:
    """Normalisation, geometry and input dtype, from the package's own metadata."""
    from predictor.packages.metadata import embedded_spec, package_input_dtype, read_metadata

    metadata = read_metadata(package)
    spec = embedded_spec(metadata)
    if spec is None:
        raise ValueError(f"{package}: no embedded spec; Triton needs its mean, std and geometry")
    return {
        "mean": ",".join(str(v) for v in (spec.mean or (0.0, 0.0, 0.0))),
        "std": ",".join(str(v) for v in (spec.std or (1.0, 1.0, 1.0))),
        "dtype": str(package_input_dtype(metadata)).removeprefix("torch."),
        "tile_size": str(spec.tile_size),
        "embedding_dim": str(spec.embedding_dim),
        "mask_threshold": str(spec.mask_threshold),
    }


def start_triton(
    package: Path,
    *,
    model: str,
    device: str,
    max_batch_size: int,
    max_latency_ms: float,
    threads: int,
    log_dir: Path,
    instances: int = 1,
) -> TritonServer:
    """``bench/triton/server.py`` under the Triton venv (not yet ready).

    Raises:
        FileNotFoundError: ``.venv-triton`` is missing.
    """
    if not available():
        raise FileNotFoundError(f"{VENV} is missing; `make bench` creates it")
    ports = (free_port(), free_port())
    metrics_port = free_port()
    facts = package_facts(package)
    args = [
        str(VENV / "bin" / "python"), str(SCRIPTS / "server.py"),
        "--package", str(package), "--model_name", model,
        "--http_port", str(ports[0]), "--grpc_port", str(ports[1]),
        "--metrics_port", str(metrics_port), "--device", device,
        "--max_batch_size", str(max_batch_size), "--max_latency_ms", str(max_latency_ms),
        "--threads", str(threads), "--instances", str(instances),
        *(item for key in ("mean", "std", "dtype", "tile_size", "embedding_dim")
          for item in (f"--{key}", facts[key])),
    ]  # fmt: skip
    server = spawn(
        args, ports=ports, log_dir=log_dir, model_name=model, env=_env(threads), kind="triton"
    )
    base = {f.name: getattr(server, f.name) for f in fields(Server)}
    return TritonServer(**base, metrics_port=metrics_port)


@dataclass(frozen=True)
class TritonModel:
    """One model of a Triton hosting several (``bench/triton/server.py --models_json``)."""

    name: str
    package: Path
    output: str  # "embedding" or "mask"
    max_batch_size: int
    max_latency_ms: float
    instances: int = 1
    mask_threshold: float | None = None  # None: the package's spec's


def start_triton_models(
    models: list[TritonModel], *, device: str, threads: int, log_dir: Path
) -> TritonServer:
    """One Triton hosting every model of ``models``, each with its own dynamic batcher
    and instance group (not yet ready; its ``model_name`` is the first model's).

    Raises:
        FileNotFoundError: ``.venv-triton`` is missing.
    """
    if not available():
        raise FileNotFoundError(f"{VENV} is missing; `make bench` creates it")
    entries = []
    for model in models:
        facts = package_facts(model.package)
        entries.append(
            {
                "model_name": model.name, "package": str(model.package), "output": model.output,
                "max_batch_size": model.max_batch_size, "max_latency_ms": model.max_latency_ms,
                "instances": model.instances, "mean": facts["mean"], "std": facts["std"],
                "dtype": facts["dtype"], "tile_size": int(facts["tile_size"]),
                "embedding_dim": int(facts["embedding_dim"]),
                "mask_threshold": model.mask_threshold or float(facts["mask_threshold"]),
            }
        )  # fmt: skip
    log_dir.mkdir(parents=True, exist_ok=True)
    models_json = log_dir / "triton-models.json"
    models_json.write_text(json.dumps(entries, indent=1))
    ports = (free_port(), free_port())
    metrics_port = free_port()
    args = [
        str(VENV / "bin" / "python"), str(SCRIPTS / "server.py"), "--models_json", str(models_json),
        "--http_port", str(ports[0]), "--grpc_port", str(ports[1]),
        "--metrics_port", str(metrics_port), "--device", device, "--threads", str(threads),
    ]  # fmt: skip
    server = spawn(
        args, ports=ports, log_dir=log_dir, model_name=models[0].name, env=_env(threads),
        kind="triton",
    )  # fmt: skip
    base = {f.name: getattr(server, f.name) for f in fields(Server)}
    return TritonServer(**base, metrics_port=metrics_port)


def start_triton_defaults(package: Path, *, model: str, device: str, log_dir: Path) -> TritonServer:
    """Triton as a user would first configure it for this package (not yet ready).

    Its dynamic batcher at its own default (no queue delay), one instance,
    torch's own thread count (one per core). Triton has no default batch
    size, so it gets histoserve's (32).
    """
    return start_triton(
        package,
        model=model,
        device=device,
        max_batch_size=32,
        max_latency_ms=0.0,
        threads=os.cpu_count() or 1,
        log_dir=log_dir,
    )


def ready_beside_triton(
    started: dict[str, Any], package: Path, *, device: str, log_dir: Path, triton: bool
) -> dict[str, Any]:
    """``started`` plus Triton at its defaults when ``triton``, all of them ready."""
    from bench.servers.launch import wait_all_ready

    if triton:
        started["triton"] = start_triton_defaults(
            package, model="bench", device=device, log_dir=log_dir
        )
    wait_all_ready(started)
    return started


def check_embeddings(
    package: Path,
    servers: Mapping[str, Server],
    *,
    model: str | None = None,
    output: str = "embedding",
    mask_threshold: float | None = None,
) -> dict[str, Any]:
    """Served answers vs the in-process forward, per server and protocol.

    ``model`` names the model on every server (default: each server's own
    ``model_name``); ``output`` is ``embedding`` (cosine at least
    :data:`COSINE_OK`) or a segmenter's ``mask`` (pixels agreeing at least
    :data:`MASK_AGREE_OK`) at ``mask_threshold`` (default: the package's spec's).

    Returns:
        ``{server: {protocol: {"max_abs", "min_cosine", "ok"}}}`` (a mask's:
        ``agree``, ``tissue``, ``expected_tissue``, ``ok``), or
        ``{"failed": reason}`` if the check itself could not run.
    """
    facts = package_facts(package)
    args = [
        str(VENV / "bin" / "python"), str(SCRIPTS / "embedding_check.py"),
        "--package", str(package), "--mean", facts["mean"], "--std", facts["std"],
        "--dtype", facts["dtype"], "--tile_size", facts["tile_size"], "--output", output,
        "--mask_threshold", str(mask_threshold or facts["mask_threshold"]),
        *(item for name, s in servers.items()
          for item in ("--server", f"{name}={s.http_url},{s.grpc_url},{model or s.model_name}")),
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_env(1))
    if proc.returncode != 0:
        return {"failed": proc.stderr[-2000:]}
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    for protocols in report.values():
        for result in protocols.values():
            if output == "mask":
                result["ok"] = result.get("agree", 0.0) >= MASK_AGREE_OK
            else:
                result["ok"] = result.get("min_cosine", 0.0) >= COSINE_OK
    return report


def _triton_batches(server: Server) -> tuple[float, float] | None:
    """Triton's ``(inferences, executions)`` counters (tiles, batches), or None."""
    port = getattr(server, "metrics_port", 0)
    if not port:
        return None
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    sums = {"nv_inference_count": 0.0, "nv_inference_exec_count": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in sums:
            sums[name] += float(line.rsplit(" ", 1)[1])
    return sums["nv_inference_count"], sums["nv_inference_exec_count"]


def run_cell_counted(
    client: LoadClient, server: Server, cell: Cell, **timing: Any
) -> dict[str, Any]:
    """One cell; on Triton, its mean batch from Triton's counters around the cell."""
    before = _triton_batches(server) if cell.server == "triton" else None
    result = run_cell(client, server, cell, **timing)
    after = _triton_batches(server) if before is not None else None
    if before and after and after[1] > before[1]:
        result["mean_batch"] = (after[0] - before[0]) / (after[1] - before[1])
        result["mean_batch_note"] = "Triton's counters over the cell, warm-up included"
    return result


def compare(
    client: LoadClient,
    servers: Mapping[str, Server],
    case: ModelCase,
    profile: Profile,
    *,
    tile_size: int,
    speed_tps: float,
    deadline: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """histoserve then Triton on each (clients, tiles, protocol) cell; the ratios of each pair."""
    cells: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []
    for clients, tiles in case.triton_cells:
        for protocol in PROTOCOLS:
            pair = {}
            for name in ("histoserve", "triton"):
                cell = Cell(name, protocol, clients, tiles)
                # ``triton_cells`` are chosen per model, so the matrix's in-flight cap
                # does not apply (16 x 32 on the demo model is over it, and is the point).
                reason = None
                if time.monotonic() > deadline:
                    reason = "the run's time budget for cells was spent"
                if reason:
                    result = {**asdict(cell), "skipped": reason}
                else:
                    result = run_cell_counted(
                        client,
                        servers[name],
                        cell,
                        tile_size=tile_size,
                        speed_tps=speed_tps,
                        windows=profile.windows,
                    )
                    log(f"  {case.label} vs triton: {name} {protocol} {clients}x{tiles}: "
                        f"{result.get('throughput', 0):.1f} tiles/s p99 {result.get('p99_ms')}")  # fmt: skip
                cells.append(result)
                pair[name] = result
            pairs.append(pair_ratio(protocol, clients, tiles, pair))
    return {"cells": cells, "pairs": pairs}


def pair_ratio(protocol: str, clients: int, tiles: int, pair: Mapping[str, Any]) -> dict[str, Any]:
    """One cell on histoserve and on Triton: the throughput ratio, both rates, p50 and p99."""
    h, t = pair["histoserve"], pair["triton"]
    out: dict[str, Any] = {"protocol": protocol, "clients": clients, "tiles": tiles}
    if h.get("throughput") and t.get("throughput"):
        out["throughput_ratio"] = h["throughput"] / t["throughput"]
        out["histoserve_tps"], out["triton_tps"] = h["throughput"], t["throughput"]
        for q in ("p50_ms", "p99_ms"):
            out[f"histoserve_{q}"], out[f"triton_{q}"] = h.get(q), t.get(q)
    return out


def wanted(profile: Profile) -> str | None:
    """Why Triton is not run in this profile, or None when it is."""
    if not profile.triton:
        return "off in this profile"
    if not available():
        return f"{VENV.name} is missing (`make bench` creates it)"
    return None


def measure(
    client: LoadClient,
    servers: Mapping[str, Server],
    case: ModelCase,
    profile: Profile,
    package: Path,
    **run: Any,
) -> dict[str, Any]:
    """The whole Triton part of one model: the embedding check, then :func:`compare`.

    ``run`` carries ``tile_size``, ``speed_tps`` and ``log`` (as for :func:`compare`).
    Triton's cells are paired with histoserve's like target cells: never skipped
    for the run's time budget.
    """
    if "triton" not in servers:
        return {"skipped": wanted(profile) or "not started"}
    pair = {name: servers[name] for name in ("histoserve", "triton")}
    check = check_embeddings(package, pair)
    bad = [
        f"{server} {protocol}: {result}"
        for server, protocols in check.items()
        if isinstance(protocols, dict)
        for protocol, result in protocols.items()
        if not result.get("ok")
    ]
    out: dict[str, Any] = {"check": check, "unfair": list(UNFAIR)}
    out["settings"] = {
        "version": "tritonserver 2.51 (nvidia-pytriton 0.7)",
        "max_batch_size": case.max_batch_size,
        "max_queue_delay_ms": case.max_latency_ms,
        "instances": 1,
    }
    if "failed" in check or bad:
        out["skipped"] = (
            f"served embeddings differ from the in-process forward: {check.get('failed') or bad}"
        )
        return out
    out.update(compare(client, servers, case, profile, deadline=float("inf"), **run))
    return out
