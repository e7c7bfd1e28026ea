"""Soak: steady mixed traffic for minutes, with the server's memory, threads and files sampled.

The long run (``-m slow``; ``HISTOSERVE_SOAK_S`` seconds, default 180) starts its own
server so its baseline is clean. Memory is compared between the end of a warm-up (the
first fifth of the run, at least 20 s) and the end: a leak shows as growth that the
warm-up did not explain. Threads and open files must not grow at all. The short
variant in the fast suite only proves the loop and the checks work.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest

from harness.server import Server
from tests.reliability.load import (
    LIMITED_FLAGS,
    RssSampler,
    env_float,
    memory_figures,
    record_figures,
    run_clients,
    running,
    summarise,
    target,
)
from tests.reliability.traffic import TilePool, mixed_job

pytestmark = pytest.mark.integration
SOAK_CLIENTS = 16


def handles(pid: int) -> tuple[int, int]:
    """Threads and open file descriptors of a process."""
    process = psutil.Process(pid)
    return process.num_threads(), process.num_fds()


def soak(server: Server, pool: TilePool, duration_s: float, warmup_s: float) -> dict:
    """Mixed traffic for ``duration_s``; handles counted once the warm-up is over."""
    baseline: dict[str, tuple[int, int]] = {}
    timer = threading.Timer(warmup_s, lambda: baseline.setdefault("h", handles(server.proc.pid)))
    with target(server, pool) as t, RssSampler(server.proc.pid, interval_s=1.0) as rss:
        timer.start()
        started = time.monotonic()
        outcomes = run_clients(
            SOAK_CLIENTS, mixed_job(t), duration_s=duration_s, max_per_client=10**7
        )
        elapsed = time.monotonic() - started
    timer.cancel()
    summary = summarise(outcomes)
    assert not summary.lost and not summary.mixed_up and not summary.wrong_status
    assert summary.server_errors_for_client_input == 0
    threads, fds = handles(server.proc.pid)
    before = baseline.get("h", (threads, fds))
    return summary.figures() | memory_figures(rss.samples, warmup_s) | {
        "duration_s": round(elapsed), "clients": SOAK_CLIENTS,
        "threads_growth": threads - before[0], "fds_growth": fds - before[1],
    }  # fmt: skip


def test_short_soak_smoke(limited_server: Server, tile_pool: TilePool):
    result = soak(limited_server, tile_pool, duration_s=5.0, warmup_s=2.0)
    assert result["sent"] > SOAK_CLIENTS
    assert result["rss_growth_mib"] < 128


@pytest.mark.slow
def test_soak_long(embedding_package_dir: Path, tmp_path: Path, tile_pool: TilePool):
    duration = env_float("HISTOSERVE_SOAK_S", 180.0)
    warmup = max(20.0, duration / 5)
    with running(embedding_package_dir, tmp_path, *LIMITED_FLAGS) as server:
        result = soak(server, tile_pool, duration_s=duration, warmup_s=warmup)
    record_figures("soak_long", result)
    assert result["threads_growth"] <= 2 and result["fds_growth"] <= 4, result
    assert result["rss_growth_mib"] < 48, result
