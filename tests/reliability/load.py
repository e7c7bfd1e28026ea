"""Bounded load against live servers, and what it measured.

The reliability suites' plain helpers (their fixtures are in ``conftest.py``):
the shared server's limits, servers and clients for a ``with`` block, closed-
loop clients bounded in requests and seconds, the counting of outcomes, RSS
sampling, Prometheus samples and the figures files for docs/reliability.md's table
(``.cache/reliability/<suite>.json``, or ``$HISTOSERVE_RELIABILITY_DIR``).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from harness.server import REPO, Server, start_server
from tests.reliability.traffic import Outcome, Target, TilePool, make_target

FIGURES_ENV = "HISTOSERVE_RELIABILITY_DIR"
CLIENTS = 64
TILES_PER_CLIENT = 4
MAX_TILES = 16
MAX_BODY_BYTES = 4_000_000
MAX_IMAGE_PIXELS = 1 << 20
MAX_REQUEST_PIXELS = 4 << 20
MAX_DECODE_PIXELS = 3 * MAX_REQUEST_PIXELS  # the default's ratio (predictor/config.py)
LIMITED_FLAGS = (
    "--max_tiles_per_request",
    str(MAX_TILES),
    "--max_body_bytes",
    str(MAX_BODY_BYTES),
    "--max_image_pixels",
    str(MAX_IMAGE_PIXELS),
    "--max_request_pixels",
    str(MAX_REQUEST_PIXELS),
    "--max_decode_pixels",
    str(MAX_DECODE_PIXELS),
    "--max_batch_size",
    "8",
    "--max_latency_ms",
    "5",
)
"""The shared server's limits: small enough that every bound is reachable cheaply."""


def env_float(name: str, default: float) -> float:
    """A float from the environment (durations of the long runs), else ``default``."""
    value = os.environ.get(name)
    return float(value) if value else default


# -- servers and clients ------------------------------------------------------------------
@contextmanager
def running(model_dir: Path, tmp: Path, *flags: str) -> Iterator[Server]:
    """A live server for the ``with`` block; stopped (SIGTERM, then kill) afterwards."""
    server = start_server(model_dir, tmp, *flags)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def target(server: Server, pool: TilePool) -> Iterator[Target]:
    """HTTP and gRPC clients for ``server``, closed afterwards."""
    t = make_target(server, pool)
    try:
        yield t
    finally:
        t.close()


# -- bounded load --------------------------------------------------------------------------
def run_clients(
    clients: int,
    job: Callable[[int, int], Outcome],
    *,
    duration_s: float,
    max_per_client: int,
    stop: threading.Event | None = None,
) -> list[Outcome]:
    """Runs ``clients`` closed-loop clients; each calls ``job(client, seq)`` until a bound.

    Bounded three ways: ``max_per_client`` requests, ``duration_s`` seconds,
    and ``stop`` when given.
    """
    deadline = time.monotonic() + duration_s

    def loop(client: int) -> list[Outcome]:
        outcomes = []
        for seq in range(max_per_client):
            if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                break
            outcomes.append(job(client, seq))
        return outcomes

    with ThreadPoolExecutor(clients, thread_name_prefix="client") as pool:
        return [o for result in pool.map(loop, range(clients)) for o in result]


@dataclass
class Summary:
    """What a load run produced, counted the way docs/reliability.md's table reports it."""

    sent: int = 0
    statuses: Counter = field(default_factory=Counter)
    lost: list[Outcome] = field(default_factory=list)
    mixed_up: list[Outcome] = field(default_factory=list)
    wrong_status: list[Outcome] = field(default_factory=list)
    server_errors_for_client_input: int = 0
    wall_s: float = 0.0

    def figures(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items(), key=str)},
            "lost": len(self.lost),
            "mixed_up": len(self.mixed_up),
            "wrong_status": len(self.wrong_status),
            "5xx_for_client_input": self.server_errors_for_client_input,
            "wall_s": round(self.wall_s, 1),
        }


def summarise(outcomes: Sequence[Outcome], *, allowed: frozenset[int] = frozenset()) -> Summary:
    """Counts outcomes; ``allowed`` statuses (e.g. 503) are not wrong for valid requests."""
    summary = Summary(sent=len(outcomes))
    for o in outcomes:
        summary.statuses[o.status] += 1
        if o.status is None:
            summary.lost.append(o)
        elif o.status == 200 and not o.correct:
            summary.mixed_up.append(o)
        elif o.status != o.expect and o.status not in allowed:
            summary.wrong_status.append(o)
        if o.expect == 400 and o.status is not None and o.status >= 500:
            summary.server_errors_for_client_input += 1
    if outcomes:
        summary.wall_s = max(o.started + o.latency_s for o in outcomes) - min(
            o.started for o in outcomes
        )
    return summary


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


# -- the server process --------------------------------------------------------------------
class RssSampler:
    """Samples a process's resident memory (MiB) in a background thread.

    Args:
        pid: The process to watch.
        interval_s: Seconds between samples.
    """

    def __init__(self, pid: int, interval_s: float = 0.5):
        self._process = psutil.Process(pid)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.samples: list[tuple[float, float]] = []

    def sample(self) -> float:
        """One sample now, recorded and returned."""
        rss = self._process.memory_info().rss / (1 << 20)
        self.samples.append((time.monotonic(), rss))
        return rss

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.sample()
            except psutil.Error:
                return

    def __enter__(self) -> RssSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def slope_mib_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of RSS over time."""
    if len(samples) < 3:
        return 0.0
    return 60 * statistics.linear_regression([t for t, _ in samples], [r for _, r in samples])[0]


def memory_figures(samples: list[tuple[float, float]], warmup_s: float) -> dict[str, float]:
    """RSS at the start, after the warm-up and at the end (medians), growth and slope."""
    start = samples[0][0]
    steady = [s for s in samples if s[0] - start >= warmup_s]
    tail = steady[-max(3, len(steady) // 10) :]
    baseline = statistics.median(r for _, r in steady[:5])
    end = statistics.median(r for _, r in tail)
    return {
        "rss_start_mib": round(samples[0][1]),
        "rss_after_warmup_mib": round(baseline),
        "rss_end_mib": round(end),
        "rss_growth_mib": round(end - baseline, 1),
        "rss_slope_mib_per_min": round(slope_mib_per_min(steady), 2),
    }


def metric_value(text: str, name: str, **labels: str) -> float:
    """A sample of a Prometheus text exposition (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def access_log_statuses(server: Server) -> Counter:
    """HTTP statuses in the server's access log."""
    return Counter(int(s) for s in re.findall(r'HTTP/1\.1" (\d{3})', server.log()))


def record_figures(suite: str, figures: dict[str, Any]) -> Path:
    """Writes a suite's measured figures as JSON for docs/reliability.md; returns the file."""
    root = Path(os.environ.get(FIGURES_ENV, REPO / ".cache" / "reliability"))
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{suite}.json"
    path.write_text(json.dumps(figures, indent=2, sort_keys=True, default=str) + "\n")
    print(f"\n[reliability] {suite}: {json.dumps(figures, sort_keys=True, default=str)}")
    return path
