"""``make gpu-check`` and ``bench/gpu.sh``: the scripts a lent GPU runs, run here first on the CPU.

No GPU here: ``make gpu-check DRY_RUN=1`` runs every stage of
:mod:`bench.gpu_check` on the CPU with the tiny packages (the tests' cache),
through the real servers, start-up and batcher, so the script a GPU machine
runs is not first executed there. A forced OOM needs a GPU's allocator: the
dry run fakes the package's failure and the allocator's ``num_ooms`` counter
(:func:`bench.gpu_stages.oom_split`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAGES = [
    "environment",
    "export",
    "served_equals_direct",
    "bf16_vs_fp32",
    "bf16_families",
    "oom_split",
    "throughput",
    "instances",
    "copy_vs_compute",
    "event_loop",
]


def test_gpu_script_parses() -> None:
    proc = subprocess.run(
        ["bash", "-n", str(REPO / "bench" / "gpu.sh")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_make_gpu_check_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    proc = subprocess.run(
        ["make", "-s", "gpu-check", "DRY_RUN=1", f"OUT={out}", f"CHECK_PYTHON={sys.executable}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "gpu-check.json").read_text())
    assert list(data) == STAGES
    assert all("error" not in r and "skipped" not in r for r in data.values()), data
    assert data["served_equals_direct"]["tiny-bf16"]["max_abs_diff"] == 0.0
    assert data["served_equals_direct"]["tiny-fp32"]["ok"]
    assert 0.99 < data["bf16_vs_fp32"]["tiny"]["min_cosine"] <= 1.0 + 1e-6
    assert data["bf16_families"]["ok"] and data["oom_split"]["answered"] == 64
    assert data["oom_split"]["batches"] == 3  # 64 failed, then its halves of 32
    throughput = data["throughput"]
    assert throughput["limit"]["tiles_per_s"] > 0
    cells = [k for k in throughput if " " in k]
    assert cells == ["v2-pixels 64x1", "v2-grpc 64x1", "v1-jpeg 64x1", "v2-pixels 16x64"]
    assert data["instances"]["ratio"] > 0 and data["copy_vs_compute"]["forward_ms"] > 0
    assert 0.0 <= data["event_loop"]["progress"] <= 1.5
    table = (out / "gpu-check.md").read_text()
    assert all(f"| {stage} |" in table for stage in STAGES)
