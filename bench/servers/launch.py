"""The benchmark's servers: histoserve (batching on or off) and the naive baseline.

Started, awaited and stopped through :mod:`harness.server` (the same code the
tests use). Every server gets the same environment (``OMP_NUM_THREADS`` = the
profile's thread count) so the limit, the baselines and histoserve use the
CPU alike.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from harness.server import Server, free_port, predictor_command, spawn


def bench_env(threads: int) -> dict[str, str]:
    """Environment for every benchmark process: pinned thread counts, unbuffered output."""
    return dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
        PYTHONWARNINGS="ignore",
    )


def start_histoserve(
    package: Path,
    *,
    model: str,
    device: str,
    max_batch_size: int,
    max_latency_ms: float,
    max_queue_size: int,
    workers: int,
    threads: int,
    log_dir: Path,
    kind: str = "histoserve",
    forward_runner: str | None = None,
    source: Path | None = None,
    instances: int = 1,
    frontends: int = 1,
    extra: tuple[str, ...] = (),
) -> Server:
    """``python -m predictor`` serving ``package`` with the given batching (not yet ready).

    ``extra`` flags are appended as given (e.g. ``("--jpeg_decode", "cpu")``).

    ``forward_runner`` is passed only when given, ``--instances_per_device``
    always (the older server of ``source`` only above 1) and ``--frontends``
    only above 1; ``source`` is a folder holding
    another version's ``predictor`` package to serve instead of this checkout's
    (see :mod:`bench.servers.before`).
    """
    ports = (free_port(), free_port())
    args = predictor_command(
        package.parent, ports,
        "--checkpoint", package.name, "--model_name", model, "--device", device,
        "--max_batch_size", str(max_batch_size), "--max_latency_ms", str(max_latency_ms),
        "--max_queue_size", str(max(max_queue_size, max_batch_size)),
        "--preprocess_workers", str(workers), "--drain_timeout_s", "5",
        *(("--forward_runner", forward_runner) if forward_runner else ()),
        *(("--instances_per_device", str(instances)) if source is None or instances > 1 else ()),
        *(("--frontends", str(frontends)) if frontends > 1 else ()),
        *extra,
    )  # fmt: skip
    env = bench_env(threads)
    return spawn(
        args, ports=ports, log_dir=log_dir, model_name=model, env=env, kind=kind, cwd=source
    )


def start_histoserve_defaults(
    package: Path, *, model: str, log_dir: Path, kind: str, frontends: int = 1
) -> Server:
    """``python -m predictor`` as a user runs it: only the package, the name and the ports.

    Every other setting is the server's default (batching, device, runner,
    instances, stage-1 workers), and its environment carries no thread
    pinning (``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` are removed), so
    torch picks its own. ``frontends`` above 1 adds ``--frontends``.
    """
    ports = (free_port(), free_port())
    args = predictor_command(
        package.parent, ports, "--checkpoint", package.name, "--model_name", model,
        *(("--frontends", str(frontends)) if frontends > 1 else ()),
    )  # fmt: skip
    env = {k: v for k, v in bench_env(1).items() if k not in UNPINNED}
    return spawn(args, ports=ports, log_dir=log_dir, model_name=model, env=env, kind=kind)


UNPINNED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Left out of a server's environment "at its defaults": torch then uses every core."""


def start_naive(package: Path, *, model: str, device: str, threads: int, log_dir: Path) -> Server:
    """The naive baseline (:mod:`bench.servers.naive`) on stock KServe (not yet ready)."""
    ports = (free_port(), free_port())
    args = [
        sys.executable, "-m", "bench.servers.naive",
        "--package", str(package), "--model_name", model, "--device", device,
        "--http_port", str(ports[0]), "--grpc_port", str(ports[1]),
    ]  # fmt: skip
    env = bench_env(threads)
    return spawn(args, ports=ports, log_dir=log_dir, model_name=model, env=env, kind="naive")


def wait_all_ready(started: Mapping[str, Server]) -> Mapping[str, Server]:
    """Waits until every started server is ready; on any failure stops them all and re-raises."""
    try:
        for server in started.values():
            server.wait_ready()
    except Exception:
        for server in started.values():
            server.stop()
        raise
    return started
