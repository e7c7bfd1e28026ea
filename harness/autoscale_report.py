"""Figures and plots of one closed autoscaling loop (:mod:`harness.autoscale_loop`).

:func:`outputs` checks the shards' work the way a user would (``status.csv``,
every ``<slide_id>.h5`` complete against the tissue grid the slide was made
with); :func:`figures` reduces a run to the numbers ``docs/deployment.md``
quotes; :func:`plot` draws replicas, queue depth and tiles/s over time.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Mapping
from pathlib import Path

import h5py

from harness.autoscale_loop import LoopConfig, LoopResult


def outputs(result: LoopResult, expected: Mapping[str, int]) -> dict[str, object]:
    """Slides done, failed, missing, re-embedded and tiles lost over every phase's output.

    ``expected``: tiles per slide id (the slide's tissue grid). A slide is lost
    when its row is not ``done`` or its file holds fewer tiles than its grid;
    re-embedded when ``status.csv`` has more than one row for it.
    """
    rows: list[dict[str, str]] = []
    files: dict[str, int] = {}
    for out in result.outs:
        with open(out / "status.csv", newline="") as handle:
            rows += list(csv.DictReader(handle))
        for path in out.glob("*.h5"):
            with h5py.File(path) as f:
                files[path.stem] = min(len(f["features"]), len(f["coords"]))
    done = {r["slide_id"] for r in rows if r["status"] == "done"}
    seen = [r["slide_id"] for r in rows]
    lost = sum(n - min(files.get(s, 0), n) for s, n in expected.items())
    return {
        "slides": len(expected),
        "done": len(done & set(expected)),
        "failed": sorted({r["slide_id"] for r in rows if r["status"] != "done"}),
        "missing": sorted(set(expected) - done),
        "re_embedded": len(seen) - len(set(seen)),
        "tiles_expected": sum(expected.values()),
        "tiles_lost": lost,
    }


def _steps(series: list[tuple[float, int]], start: float, end: float) -> list[int]:
    """The values a step function takes within ``[start, end]`` (changes only)."""
    values = [v for t, v in series if start <= t <= end]
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def figures(cfg: LoopConfig, result: LoopResult) -> dict[str, object]:
    """Scale-out time, replica changes and flaps per phase, tiles/s per ready replicas, 503s."""
    samples = result.samples
    replicas = [(s["t"], s["replicas"]) for s in samples]
    phases = []
    for start, end, shards in result.phases:
        first = replicas[0][1] if replicas else 0
        before = next((v for t, v in reversed(replicas) if t <= start), first)
        step_up = shards > (result.phases[len(phases) - 1][2] if phases else 0)
        asked_up = next((t for t, n in result.decisions if start <= t <= end and n > before), None)
        if not step_up:  # time to scale out: measured from a step up of the load only
            asked_up = None
        ready_up = next(
            (s["t"] for s in samples if asked_up is not None and s["t"] >= asked_up
             and s["ready"] > before), None)  # fmt: skip
        steps = _steps(replicas, start, end)
        turns = sum(
            1 for a, b, c in zip(steps, steps[1:], steps[2:], strict=False) if (b - a) * (c - b) < 0
        )
        phases.append({
            "shards": shards, "seconds": round(end - start, 2), "replicas_at_start": before,
            "replicas_seen": steps, "changes": max(0, len(steps) - 1), "flaps": turns,
            "scale_out_decided_s": None if asked_up is None else round(asked_up - start, 2),
            "scale_out_ready_s": None if ready_up is None else round(ready_up - start, 2),
        })  # fmt: skip
    rate: dict[int, list[float]] = {}
    for a, b in itertools.pairwise(samples):
        if b["t"] > a["t"] and a["ready"] == b["ready"] and b["tiles"] >= a["tiles"]:
            rate.setdefault(b["ready"], []).append((b["tiles"] - a["tiles"]) / (b["t"] - a["t"]))
    p = cfg.isvc["spec"]["predictor"]
    return {
        "time_scale": cfg.time_scale,
        "cold_start_s": cfg.cold_start_s,
        "ramp": list(cfg.ramp),
        "chart": {
            k: p.get(k)
            for k in ("minReplicas", "maxReplicas", "scaleMetric", "scaleTarget", "autoScaling")
            if k in p
        },
        "phases": phases,
        "tiles_per_s_by_ready": {n: round(sum(v) / len(v), 1) for n, v in sorted(rate.items())},
        "peak_queue": max((s["queue"] for s in samples), default=0),
        "peak_inflight": max((s["inflight"] for s in samples), default=0),
        "peak_cpu_percent_of_request": round(max((s["cpu_avg"] for s in samples), default=0), 1),
        "replicas_max": max((s["replicas"] for s in samples), default=0),
        "responses_503_retried": result.responses_503,
        "shard_exit_codes": result.shard_codes,
        "seconds": round(samples[-1]["t"], 1) if samples else 0,
    }


def plot(result: LoopResult, title: str, path: Path) -> Path:
    """Replicas (wanted and ready), queue depth and tiles/s over time, phases shaded; a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result.samples
    t = [x["t"] for x in s]
    fig, (a, b, c) = plt.subplots(3, 1, sharex=True, figsize=(8, 7))
    a.step(t, [x["replicas"] for x in s], where="post", label="replicas (spec)")
    a.step(t, [x["ready"] for x in s], where="post", label="ready")
    a.set_ylabel("replicas")
    a.legend(loc="upper right")
    b.plot(t, [x["queue"] for x in s], label="queue depth (tiles)")
    b.plot(t, [x["inflight"] for x in s], label="in-flight requests")
    if any(x["cpu_avg"] for x in s):
        b.plot(t, [x["cpu_avg"] for x in s], label="CPU % of request (mean)", lw=0.8)
    b.legend(loc="upper right")
    tps = [0.0] + [
        max(0.0, (y["tiles"] - x["tiles"]) / (y["t"] - x["t"])) if y["t"] > x["t"] else 0.0
        for x, y in itertools.pairwise(s)
    ]
    c.plot(t, tps, lw=0.8)
    c.set_ylabel("tiles/s")
    c.set_xlabel("seconds (scaled clock)")
    for ax in (a, b, c):
        for i, (start, end, shards) in enumerate(result.phases):
            ax.axvspan(start, end, alpha=0.08 + 0.04 * (i % 2), color="grey")
            if ax is a:
                ax.text(start, 0.02, f"{shards} shard(s)", fontsize=8,
                        transform=ax.get_xaxis_transform())  # fmt: skip
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write(cfg: LoopConfig, result: LoopResult, checked: dict, name: str, out_dir: Path) -> dict:
    """``<name>.json`` (figures and output checks) and ``<name>.png`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    found = {**figures(cfg, result), "outputs": checked}
    (out_dir / f"{name}.json").write_text(json.dumps(found, indent=2, default=str) + "\n")
    plot(result, name, out_dir / f"{name}.png")
    return found
