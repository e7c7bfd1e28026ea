"""``python -m bench.stages.embed_client``: does ``histoserve embed`` keep up with the server?

One generated slide of >= 20,000 tiles (written at the model's mpp with JPEG
tiles, so tiles are read as is; cached under ``.cache/bench-slides/``) and one
histoserve server. Three rates, one after the other:

- **read**: the client's read-ahead pool alone (``histoserve``'s own
  reader threads and queue, requests replaced by nothing), over the first
  ``read_tiles`` tiles;
- **server**: the existing closed-loop load generator (:mod:`bench.load.generator`)
  sending the same request shape (``batch_size`` raw tiles, ``concurrency``
  clients) for a window;
- **end to end**: the ``histoserve embed`` CLI over the whole slide (its own
  process; its peak RSS from ``wait4``), tiles / the slide's seconds in
  ``status.csv`` (open, plan, read, send, write).

Target: end to end >= 0.9 x the slower of read and server. On a shared CPU box
the client and the server compete for the same cores in the end-to-end run,
so every phase records who used the CPU (this process, the server, the embed
client, everyone else) as in the rest of the benchmark.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.load.probes import machine_busy_s, own_cpu_s, process_cpu_s

REPO = Path(__file__).resolve().parents[2]
SLIDE_CACHE = REPO / ".cache" / "bench-slides"
TARGET_RATIO = 0.9


@dataclass(frozen=True)
class EmbedBench:
    """What the client benchmark runs.

    Attributes:
        spec: Model spec of the demo package served.
        preset: Demo preset (``tiny``: the server is fast, so the client is stressed).
        columns: Slide width in tiles.
        rows: Slide height in tiles (``columns * rows`` tiles in all).
        mpp: The slide's level-0 mpp (the model's, so no resize).
        batch_size: Tiles per request (client and load generator alike).
        concurrency: Requests in flight.
        read_workers: The client's read threads.
        read_tiles: Tiles read in the read-alone phase.
        server_window_s: The load generator's measured window.
        max_batch_size: histoserve's ``--max_batch_size``.
        device: The server's ``--device``.
        threads: Torch threads of the server.
    """

    spec: str = "h0-mini"
    preset: str = "tiny"
    columns: int = 160
    rows: int = 128
    mpp: float = 0.5
    batch_size: int = 64
    concurrency: int = 4
    read_workers: int = 2
    read_tiles: int = 6000
    server_window_s: float = 20.0
    max_batch_size: int = 64
    device: str = "cpu"
    threads: int = 1


def bench_slide(cfg: EmbedBench, tile_size: int) -> Path:
    """The benchmark slide (generated once, then cached): whole-slide tissue, JPEG tiles."""
    from harness import slides

    width, height = cfg.columns * tile_size, cfg.rows * tile_size
    path = SLIDE_CACHE / f"bench-{width}x{height}-{cfg.mpp:g}.tiff"
    if path.is_file():
        return path
    SLIDE_CACHE.mkdir(parents=True, exist_ok=True)
    spec = slides.SlideSpec(
        width=width, height=height, boxes=((0, 0, width, height),), mpp=(cfg.mpp, cfg.mpp),
        vendor="generic", downsamples=(1, 16), compression="jpeg", tile=256,
    )  # fmt: skip
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.tiff")
    slides.write_slide(tmp, spec)
    os.replace(tmp, path)
    return path


class CpuProbe:
    """Cores used between :meth:`start` and :meth:`stop`: by pid, and everything else."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids

    def start(self) -> CpuProbe:
        self._t = time.monotonic()
        self._busy = machine_busy_s() or 0.0
        self._own = own_cpu_s()
        self._cpu = {k: process_cpu_s(p) or 0.0 for k, p in self.pids.items()}
        return self

    def stop(self, extra_cpu_s: dict[str, float] | None = None) -> dict[str, float]:
        span = max(time.monotonic() - self._t, 1e-9)
        cores = {"bench_cores": (own_cpu_s() - self._own) / span}
        for name, pid in self.pids.items():
            cores[f"{name}_cores"] = ((process_cpu_s(pid) or 0.0) - self._cpu[name]) / span
        for name, seconds in (extra_cpu_s or {}).items():
            cores[f"{name}_cores"] = seconds / span
        busy = ((machine_busy_s() or 0.0) - self._busy) / span
        cores["machine_cores"] = busy
        cores["other_cores"] = max(
            0.0, busy - sum(v for k, v in cores.items() if k != "machine_cores")
        )
        return {k: round(v, 2) for k, v in cores.items()}


def read_rate(slide: Path, cfg: EmbedBench, tile_size: int) -> dict[str, Any]:
    """Tiles/s of the client's reader threads and queue alone (no requests)."""
    from histoserve.embedding.batches import BatchStats, run_batches
    from histoserve.embedding.slide_job import _ThreadReaders
    from histoserve.slides.grid import plan_tiles
    from histoserve.slides.readers import SlideReader, resolve_mpp

    with SlideReader.open(slide) as reader:
        mpp = resolve_mpp(reader, None, None, 0.05)
        plan = plan_tiles(reader, mpp, cfg.mpp, tile_size, 0.05)
    coords = plan.coords[: cfg.read_tiles]
    readers = _ThreadReaders(slide, plan, coords, cfg.batch_size)
    stats, probe = BatchStats(), CpuProbe({}).start()
    start = time.monotonic()
    try:
        run_batches(
            len(coords), cfg.batch_size, readers.read, lambda tiles, rows: {},
            read_workers=cfg.read_workers, concurrency=cfg.concurrency,
            queue_batches=max(2, cfg.read_workers), stats=stats,
        )  # fmt: skip
    finally:
        readers.close()
    seconds = time.monotonic() - start
    return {
        "tiles": len(coords),
        "seconds": seconds,
        "tiles_per_s": len(coords) / seconds,
        "read_ms_per_batch": 1000 * stats.read_s / max(1, -(-len(coords) // cfg.batch_size)),
        **probe.stop(),
    }


def server_rate(server: Any, cfg: EmbedBench, tile_size: int) -> dict[str, Any]:
    """Tiles/s of the server under the load generator, same request shape as the client."""
    from bench.matrix.cells import LoadClient

    job = {
        "protocol": "v2-pixels", "concurrency": cfg.concurrency, "tiles": cfg.batch_size,
        "model": server.model_name, "http": server.http_url, "grpc": server.grpc_url,
        "tile_size": tile_size, "warmup_s": 3.0, "window_s": cfg.server_window_s,
        "drain_s": 30.0, "max_requests": 100_000, "timeout_s": 120.0,
        "server_pid": server.pid, "metrics": True,
    }  # fmt: skip
    client = LoadClient()
    try:
        result = client.run(job)
    finally:
        client.close()
    if "failed" in result:
        raise RuntimeError(f"load generator failed: {result['failed']}")
    keys = ("throughput", "requests", "p50_ms", "mean_batch", "window_s")
    keys += ("server_cores", "client_cores", "machine_cores", "other_cores")
    return {k: result.get(k) for k in keys}


def end_to_end(server: Any, slide: Path, cfg: EmbedBench, out: Path) -> dict[str, Any]:
    """The CLI over the whole slide: tiles/s, seconds, peak RSS, CPU by process."""
    from harness.embed import embed_command

    args = embed_command(
        slide, "--url", server.base, "--out", out, "--tissue", "none", "--force",
        "--batch-size", cfg.batch_size, "--concurrency", cfg.concurrency,
        "--read-workers", cfg.read_workers, "--progress", "none",
    )  # fmt: skip
    probe = CpuProbe({"server": server.pid}).start()
    start = time.monotonic()
    proc = subprocess.Popen(args, cwd=REPO, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    cpu = probe.stop({"embed_client": usage.ru_utime + usage.ru_stime})
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"histoserve embed failed: {stderr[-2000:]}")
    with open(out / "status.csv", newline="") as fh:
        row = list(csv.DictReader(fh))[-1]
    tiles, seconds = int(row["n_tiles"]), float(row["seconds"])
    return {
        "tiles": tiles,
        "slide_seconds": seconds,
        "process_seconds": wall,
        "tiles_per_s": tiles / seconds,
        "slides_per_hour": 3600.0 / seconds,
        "peak_rss_mib": usage.ru_maxrss / 1024.0,
        **cpu,
    }


def measure(cfg: EmbedBench, log_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs the three phases against one freshly started server; returns every figure."""
    from bench.servers.launch import start_histoserve
    from harness.packages import demo_package
    from predictor.spec import resolve_spec

    tile_size = resolve_spec(cfg.spec).tile_size
    opts = {"device": cfg.device} if cfg.device.startswith("cuda") else {}
    package = demo_package(cfg.spec, cfg.preset, **opts)
    slide = bench_slide(cfg, tile_size)
    log(f"embed client: slide {slide.name} ({cfg.columns * cfg.rows} tiles)")
    results: dict[str, Any] = {"config": asdict(cfg), "slide": str(slide)}
    results["read"] = read_rate(slide, cfg, tile_size)
    log(f"embed client: read alone {results['read']['tiles_per_s']:.0f} tiles/s")
    server = start_histoserve(
        package, model=cfg.spec, device=cfg.device, max_batch_size=cfg.max_batch_size,
        max_latency_ms=5.0, max_queue_size=4096, workers=2, threads=cfg.threads,
        log_dir=log_dir,
    )  # fmt: skip
    try:
        server.wait_ready()
        results["server"] = server_rate(server, cfg, tile_size)
        log(f"embed client: server alone {results['server']['throughput']:.0f} tiles/s")
        with tempfile.TemporaryDirectory(prefix="embed-bench-") as tmp:
            results["end_to_end"] = end_to_end(server, slide, cfg, Path(tmp))
    finally:
        server.stop()
    e2e = results["end_to_end"]["tiles_per_s"]
    slower = min(results["read"]["tiles_per_s"], results["server"]["throughput"])
    results["ratio"] = e2e / slower
    results["target_met"] = results["ratio"] >= TARGET_RATIO
    # On a shared CPU box the client takes cores from the server; per core-second of
    # the server, a client that keeps it fed matches the load generator.
    server_cores = results["server"].get("server_cores") or 0.0
    e2e_cores = results["end_to_end"].get("server_cores") or 0.0
    if server_cores > 0 and e2e_cores > 0:
        alone = results["server"]["throughput"] / server_cores
        results["per_server_core"] = {
            "server_alone": alone,
            "end_to_end": e2e / e2e_cores,
            "ratio": (e2e / e2e_cores) / alone,
        }
    log(f"embed client: end to end {e2e:.0f} tiles/s = {results['ratio']:.2f} x the slower")
    return results


def markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown section."""
    r, s, e = results["read"], results["server"], results["end_to_end"]
    cfg = results["config"]
    return "\n".join(
        [
            "## Slide client (`histoserve embed`)",
            "",
            f"One slide of {e['tiles']} tiles ({cfg['columns']}x{cfg['rows']}, JPEG, "
            f"{cfg['mpp']} um/px), `--batch-size {cfg['batch_size']} --concurrency "
            f"{cfg['concurrency']} --read-workers {cfg['read_workers']}`, demo "
            f"`{cfg['spec']}` ({cfg['preset']}) on one server.",
            "",
            "| phase | tiles/s | CPU cores used (who) |",
            "| --- | ---: | --- |",
            f"| read alone ({r['tiles']} tiles) | {r['tiles_per_s']:.0f} | "
            f"reader {r['bench_cores']}, others {r['other_cores']} |",
            f"| server alone (load generator) | {s['throughput']:.0f} | "
            f"server {_r(s['server_cores'])}, loadgen {_r(s['client_cores'])}, "
            f"others {_r(s['other_cores'])} |",
            f"| end to end | {e['tiles_per_s']:.0f} | client {e['embed_client_cores']}, "
            f"server {e['server_cores']}, others {e['other_cores']} |",
            "",
            f"End to end / slower of the two: **{results['ratio']:.2f}** (target >= "
            f"{TARGET_RATIO}: {'met' if results['target_met'] else 'missed'}); "
            f"{e['slides_per_hour']:.1f} slides/hour at this size; peak client RSS "
            f"{e['peak_rss_mib']:.0f} MiB.",
            *_per_core_line(results),
            "",
        ]
    )


def _per_core_line(results: dict[str, Any]) -> list[str]:
    per = results.get("per_server_core")
    if not per:
        return []
    return [
        "",
        f"Per server core-second: {per['server_alone']:.0f} tiles alone, "
        f"{per['end_to_end']:.0f} end to end (ratio {per['ratio']:.2f}).",
    ]


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def main(argv: list[str] | None = None) -> int:
    """Runs the client benchmark; writes ``embed_client.json`` and ``embed_client.md``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.stages.embed_client", description=__doc__
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--columns", type=int, default=EmbedBench.columns)
    parser.add_argument("--rows", type=int, default=EmbedBench.rows)
    parser.add_argument("--read-tiles", type=int, default=EmbedBench.read_tiles)
    parser.add_argument("--read-workers", type=int, default=EmbedBench.read_workers)
    parser.add_argument("--concurrency", type=int, default=EmbedBench.concurrency)
    parser.add_argument("--window-s", type=float, default=EmbedBench.server_window_s)
    args = parser.parse_args(argv)
    cfg = EmbedBench(
        columns=args.columns, rows=args.rows, read_tiles=args.read_tiles,
        read_workers=args.read_workers, concurrency=args.concurrency,
        server_window_s=args.window_s,
    )  # fmt: skip
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.threads))
    results = write(measure(cfg, args.out / "logs.tmp", log=_log), args.out)
    print(markdown(results))
    return 0


def write(results: dict[str, Any], out: Path) -> dict[str, Any]:
    """Writes ``embed_client.json`` and ``embed_client.md`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "embed_client.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "embed_client.md").write_text(markdown(results))
    return results


def _log(message: str) -> None:
    print(f"[embed bench] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
