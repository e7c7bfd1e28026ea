"""Cold start: ``python -m predictor`` from process start to ready, split into its parts.

What scale-from-zero and every autoscaler step-up pays (issue 12). For each
package, a new server process is started ``runs`` times with the page cache
warm, and (when ``posix_fadvise`` can drop it without root) as many times with
the package's pages dropped first, alternating warm and dropped so that a
drifting machine load hits both alike. Each start is split into:

* ``imports``: process start to the first start-up phase (interpreter,
  imports, flag parsing and KServe's server object), from the monotonic clock
  the bench read before ``exec`` and the one start-up logs as it begins
  (``CLOCK_MONOTONIC`` is system-wide on Linux, so both clocks are one);
* the server's own phases from ``startup_seconds`` in
  ``GET /v2/models/{name}/config``: ``digest``, ``metadata``, ``extraction``
  (the GIL-free runner's; with torch's loader ``load`` includes it), ``load``,
  ``probe``, ``warmup``;
* ``other``: what start-up did between its phases (spec and device resolution);
* ``server_start``: model built to ``/v2/health/ready`` answering 200 (the HTTP
  and gRPC servers starting, plus at most one poll interval).

Beside it: the time to read the package file once (8 MiB reads), warm and
dropped, and the cores other processes used during each start (2 shared cores
here: a neighbour's job slows a start). ``python -m bench.stages.coldstart --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.markdown import number as _f
from bench.profiles import ModelCase, Profile

BEGIN_RE = re.compile(r"start-up begins at monotonic ([0-9]+\.[0-9]+) s")
BUILT_RE = re.compile(r"model built at monotonic ([0-9]+\.[0-9]+) s")
PHASES = ("digest", "metadata", "extraction", "load", "probe", "warmup")
PARTS = ("imports", *PHASES, "other", "server_start")
MODEL_NAME = "coldstart"
VIT_G = ModelCase(label="vit-g", spec="h0", preset="vit-g", dtype="bf16")
_READ_CHUNK = 8 << 20


@dataclass(frozen=True)
class ColdStartConfig:
    """How each package is started.

    Attributes:
        runs: Starts per cache state (and reads of the file per cache state).
        device: ``--device`` of the server.
        threads: ``OMP_NUM_THREADS`` of the server (the benchmark profile's).
        forward_runner: ``--forward_runner`` (``gil_free`` reports extraction apart).
        drop_cache: Also start with the package's page cache dropped.
        poll_s: Interval between readiness polls (bounds the ready time's error).
        timeout_s: Longest wait for one start to become ready.
    """

    runs: int = 3
    device: str = "cpu"
    threads: int = 1
    forward_runner: str = "gil_free"
    drop_cache: bool = True
    poll_s: float = 0.01
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError(f"runs must be >= 1, got {self.runs}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if not 0 < self.poll_s <= 1:
            raise ValueError(f"poll_s must be in (0, 1], got {self.poll_s}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


def cases_for(profile: Profile) -> tuple[ModelCase, ...]:
    """The packages a profile cold-starts.

    The tiny profile: its demo package (a fast harness check). Every other:
    its models but the demo one, plus ViT-g in bf16 (what a deployment of a
    ~1.1B-parameter model ships; exported once and cached like the others).
    """
    if profile.name == "tiny":
        return profile.models
    cases = [m for m in profile.models if m.label != "demo"]
    if not any(m.label == VIT_G.label for m in cases):
        cases.append(VIT_G)
    return tuple(cases)


def drop_page_cache(path: Path) -> bool:
    """Asks the kernel to drop ``path``'s cached pages (no root needed); False where unsupported.

    ``POSIX_FADV_DONTNEED`` drops clean pages only; a package is not written
    while served, so all of its pages are clean.
    """
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # nothing dirty may stay behind
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def read_once_s(path: Path, *, drop: bool = False) -> float:
    """Seconds to read ``path`` once in 8 MiB reads (after dropping its pages when ``drop``)."""
    if drop:
        drop_page_cache(path)
    buffer = bytearray(_READ_CHUNK)
    start = time.monotonic()
    with open(path, "rb", buffering=0) as fh:
        while fh.readinto(buffer):
            pass
    return time.monotonic() - start


def parse_anchors(log_text: str) -> tuple[float, float]:
    """The monotonic clock at start-up's beginning and when the model was built, from the log.

    Raises:
        ValueError: A line is missing (a server without the cold-start log lines).
    """
    begin, built = BEGIN_RE.search(log_text), BUILT_RE.search(log_text)
    if begin is None or built is None:
        raise ValueError("the server log lacks the 'start-up begins' / 'model built' lines")
    return float(begin.group(1)), float(built.group(1))


def split_start(
    t0: float, ready: float, anchors: tuple[float, float], phases: Mapping[str, float]
) -> dict[str, float]:
    """One start's parts in seconds (:data:`PARTS` plus ``total``); they add up to ``total``.

    Args:
        t0: Monotonic clock just before the process was started.
        ready: Monotonic clock when readiness answered 200.
        anchors: Start-up's begin and built clocks (:func:`parse_anchors`).
        phases: ``startup_seconds`` as served (phases it lacks count 0).

    Raises:
        ValueError: Clocks out of order (not one clock, or a parsing error).
    """
    begin, built = anchors
    if not t0 <= begin <= built <= ready:
        raise ValueError(f"clocks out of order: {t0=}, {begin=}, {built=}, {ready=}")
    parts = {"total": ready - t0, "imports": begin - t0}
    parts.update({name: float(phases.get(name, 0.0)) for name in PHASES})
    parts["other"] = max(0.0, (built - begin) - sum(parts[name] for name in PHASES))
    parts["server_start"] = ready - built
    return parts


def _wait_ready(server: Any, cfg: ColdStartConfig) -> float:
    """Polls ``/v2/health/ready`` every ``poll_s``; the monotonic clock of the first 200."""
    import httpx

    from harness.server import ServerFailed

    deadline = time.monotonic() + cfg.timeout_s
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise ServerFailed(f"cold start exited {server.proc.returncode}:\n{server.tail()}")
            try:
                if http.get(f"{server.base}/v2/health/ready").status_code == 200:
                    return time.monotonic()
            except httpx.HTTPError:
                pass
            time.sleep(cfg.poll_s)  # polling a child process: there is no event to wait on
    raise ServerFailed(f"cold start not ready in {cfg.timeout_s}s:\n{server.tail()}")


def start_once(package: Path, cfg: ColdStartConfig, log_dir: Path, *, drop: bool) -> dict:
    """One server start: its parts (:func:`split_start`) and the cores used meanwhile."""
    import httpx

    from bench.load.probes import machine_busy_s, own_cpu_s, process_cpu_s
    from bench.servers.launch import bench_env
    from harness.server import free_port, predictor_command, spawn

    if drop:
        drop_page_cache(package)
    ports = (free_port(), free_port())
    args = predictor_command(
        package.parent, ports, "--checkpoint", package.name, "--model_name", MODEL_NAME,
        "--device", cfg.device, "--forward_runner", cfg.forward_runner,
    )  # fmt: skip
    env = bench_env(cfg.threads)
    busy0, own0 = machine_busy_s(), own_cpu_s()
    t0 = time.monotonic()
    server = spawn(args, ports=ports, log_dir=log_dir, model_name=MODEL_NAME, env=env, kind="cold")
    try:
        ready = _wait_ready(server, cfg)
        busy1, own1 = machine_busy_s(), own_cpu_s()
        server_cpu = process_cpu_s(server.pid)
        url = f"{server.base}/v2/models/{MODEL_NAME}/config"
        phases = httpx.get(url, timeout=10).json()["startup_seconds"]
        parts = split_start(t0, ready, parse_anchors(server.log()), phases)
    finally:
        server.stop()
    span = max(ready - t0, 1e-9)
    if busy0 is not None and busy1 is not None and server_cpu is not None:
        other = (busy1 - busy0) - server_cpu - (own1 - own0)
        parts["server_cores"] = server_cpu / span
        parts["other_cores"] = max(0.0, other / span)
    return parts


def summarise(runs: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Median of every part over the runs, and the totals' range."""
    keys = [
        k for k in ("total", *PARTS, "server_cores", "other_cores") if all(k in r for r in runs)
    ]
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in keys}
    out["total_range"] = [min(r["total"] for r in runs), max(r["total"] for r in runs)]
    out["runs"] = len(runs)
    return out


def measure_package(
    package: Path, cfg: ColdStartConfig, log_dir: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Reads and starts for one package, warm and dropped alternating (see the module docstring)."""
    states = ["warm", "dropped"] if cfg.drop_cache and drop_page_cache(package) else ["warm"]
    read_once_s(package)  # the first warm read must find the file cached
    reads: dict[str, list[float]] = {s: [] for s in states}
    starts: dict[str, list[dict]] = {s: [] for s in states}
    for _ in range(cfg.runs):
        for state in states:
            reads[state].append(read_once_s(package, drop=state == "dropped"))
    for i in range(cfg.runs):
        for state in states:
            if state == "warm":
                read_once_s(package)  # after a dropped start the file is partly cached
            parts = start_once(package, cfg, log_dir, drop=state == "dropped")
            starts[state].append(parts)
            log(f"cold start {package.name} {state} {i + 1}/{cfg.runs}: {parts['total']:.2f} s")
    return {
        "package": str(package),
        "package_mb": package.stat().st_size / 2**20,
        "config": asdict(cfg),
        "read_once_s": {s: statistics.median(v) for s, v in reads.items()},
        "starts": {s: summarise(v) for s, v in starts.items()},
        "raw": {s: v for s, v in starts.items()},
    }


def section(part: Mapping[str, Any] | None) -> list[str]:
    """The results markdown section (empty when the stage did not run)."""
    if not part:
        return []
    lines = [
        "## Cold start: process start to ready",
        "",
        "A new `python -m predictor` process per start; medians over the runs, seconds. "
        "*warm*: the package in the page cache; *dropped*: its pages dropped first "
        "(`posix_fadvise DONTNEED`). *imports*: process start to the first phase; *other*: "
        "between phases; *server start*: model built to `/v2/health/ready`. Extraction – means "
        "torch's loader, whose *load* includes it. *read once*: reading the file, nothing else.",
        "",
        "| model | package MB | cache | read once | total (min–max) | imports | digest | metadata "
        "| extraction | load | probe | warm-up | other | server start | cores: server / other |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, result in part.items():
        for state, s in result["starts"].items():
            lo, hi = s["total_range"]
            extraction = (
                s.get("extraction") if result["config"]["forward_runner"] == "gil_free" else None
            )
            lines.append(
                f"| {label} | {result['package_mb']:.0f} | {state} "
                f"| {_f(result['read_once_s'][state], 3)} | {_f(s['total'], 2)} ({_f(lo, 2)}–{_f(hi, 2)}) "
                f"| {_f(s['imports'], 3)} | {_f(s['digest'], 3)} | {_f(s['metadata'], 3)} "
                f"| {_f(extraction, 3)} | {_f(s['load'], 3)} | {_f(s['probe'], 3)} | {_f(s['warmup'], 3)} "
                f"| {_f(s['other'], 3)} | {_f(s['server_start'], 3)} "
                f"| {_f(s.get('server_cores'), 2)} / {_f(s.get('other_cores'), 2)} |"
            )
    return [*lines, ""]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(prog="python -m bench.stages.coldstart", description=__doc__)
    parser.add_argument("packages", nargs="+", type=Path, help="LABEL=PATH or PATH of a .pt2")
    parser.add_argument("--runs", type=int, default=ColdStartConfig.runs)
    parser.add_argument("--device", default=ColdStartConfig.device)
    parser.add_argument("--threads", type=int, default=ColdStartConfig.threads)
    parser.add_argument("--forward_runner", default=ColdStartConfig.forward_runner)
    parser.add_argument("--no-drop", action="store_true", help="warm page cache only")
    parser.add_argument("--log_dir", type=Path, default=Path("bench/results/logs.tmp"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Measures the given packages and prints the JSON and the markdown section."""
    args = parse_args(argv)
    cfg = ColdStartConfig(
        runs=args.runs,
        device=args.device,
        threads=args.threads,
        forward_runner=args.forward_runner,
        drop_cache=not args.no_drop,
    )
    results = {}
    for item in args.packages:
        label, _, path = str(item).rpartition("=")
        path_ = Path(path)
        results[label or path_.stem] = measure_package(path_, cfg, args.log_dir)
    print(json.dumps(results, indent=1))
    print("\n".join(section(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
