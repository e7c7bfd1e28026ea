"""Window probes: server metrics and CPU use at the start and end of a measured window.

From two snapshots a cell gets its mean batch size and the server's time split
(``histoserve_*`` Prometheus histograms), and who used the CPU: the server
process, the load client itself, and everything else on the machine (other
people's jobs on a shared host), in cores. Linux ``/proc`` only; elsewhere the
CPU fields are absent. No kserve or torch imports (the load process uses it).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
METRICS = (
    "histoserve_batch_size_sum",
    "histoserve_batch_size_count",
    "histoserve_forward_seconds_sum",
    "histoserve_forward_seconds_count",
    "histoserve_preprocess_seconds_sum",
    "histoserve_preprocess_seconds_count",
    "histoserve_queue_wait_seconds_sum",
    "histoserve_queue_wait_seconds_count",
)


@dataclass
class Snapshot:
    """Counters at one instant (monotonic ``at``)."""

    at: float
    metrics: dict[str, float] = field(default_factory=dict)
    server_cpu_s: float | None = None
    client_cpu_s: float = 0.0
    busy_s: float | None = None


def parse_metrics(text: str) -> dict[str, float]:
    """Sums of the :data:`METRICS` series over all label sets in Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("histoserve_"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in METRICS:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _stat(pid: int | str) -> tuple[int, float] | None:
    """``(parent pid, user + system CPU seconds)`` of one process, or None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` and its live descendants (all threads), or None.

    Descendants count because a server may be a process tree (Triton: pytriton,
    tritonserver, the Python backend's stub); histoserve is one process.
    """
    own = _stat(pid)
    if own is None:
        return None
    children: dict[int, list[tuple[int, float]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != pid:
            stat = _stat(entry)
            if stat is not None:
                children.setdefault(stat[0], []).append((int(entry), stat[1]))
    total, todo = own[1], [pid]
    while todo:
        for child, cpu in children.get(todo.pop(), []):
            total += cpu
            todo.append(child)
    return total


def own_cpu_s() -> float:
    """User + system CPU seconds of this process alone (not its children)."""
    times = os.times()
    return times.user + times.system


def machine_busy_s() -> float | None:
    """CPU seconds all cores spent busy since boot (``/proc/stat``), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            values = [int(v) for v in fh.readline().split()[1:]]
    except OSError:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / TICK


async def snapshot(job: Any, session: Any) -> Snapshot:
    """Snapshot for ``job``: its server's metrics (when it has them) and CPU counters."""
    snap = Snapshot(at=time.monotonic())
    if job.metrics:
        async with session.get(f"http://{job.http}/metrics") as resp:
            snap.metrics = parse_metrics(await resp.text())
    if job.server_pid:
        snap.server_cpu_s = process_cpu_s(job.server_pid)
    times = os.times()
    snap.client_cpu_s = times.user + times.system
    snap.busy_s = machine_busy_s()
    return snap


def _delta(a: Snapshot, b: Snapshot, name: str) -> float:
    return b.metrics.get(name, 0.0) - a.metrics.get(name, 0.0)


def summarise_window(a: Snapshot, b: Snapshot) -> dict[str, Any]:
    """Mean batch size, the server's time split and CPU use between two snapshots."""
    span = max(b.at - a.at, 1e-9)
    out: dict[str, Any] = {}
    batches = _delta(a, b, "histoserve_batch_size_count")
    if batches > 0:
        out["mean_batch"] = _delta(a, b, "histoserve_batch_size_sum") / batches
        out["batches"] = int(batches)
        out["forward_busy"] = _delta(a, b, "histoserve_forward_seconds_sum") / span
        out["forward_ms_per_batch"] = (
            1000.0 * _delta(a, b, "histoserve_forward_seconds_sum") / batches
        )
    waits = _delta(a, b, "histoserve_queue_wait_seconds_count")
    if waits > 0:
        out["queue_wait_ms"] = 1000.0 * _delta(a, b, "histoserve_queue_wait_seconds_sum") / waits
    preps = _delta(a, b, "histoserve_preprocess_seconds_count")
    if preps > 0:
        out["preprocess_ms"] = 1000.0 * _delta(a, b, "histoserve_preprocess_seconds_sum") / preps
    out["client_cores"] = (b.client_cpu_s - a.client_cpu_s) / span
    if a.server_cpu_s is not None and b.server_cpu_s is not None:
        out["server_cores"] = (b.server_cpu_s - a.server_cpu_s) / span
    if a.busy_s is not None and b.busy_s is not None:
        busy = (b.busy_s - a.busy_s) / span
        out["machine_cores"] = busy
        out["other_cores"] = max(0.0, busy - out["client_cores"] - out.get("server_cores", 0.0))
    return out
