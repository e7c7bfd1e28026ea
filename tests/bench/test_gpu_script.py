"""``bench/gpu.sh`` and its GPU-only parts: syntax, and a dry run of the parts on the CPU.

No GPU here: the dry run (``--device cpu``) runs the same code through the
real start-up and batcher, so the script a GPU node runs is not first
executed there.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import gpu_parts

REPO = Path(__file__).resolve().parents[2]


def test_gpu_script_parses() -> None:
    proc = subprocess.run(
        ["bash", "-n", str(REPO / "bench" / "gpu.sh")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_gpu_parts_dry_run_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--device", "cpu", "--seconds", "0.5", "--batch", "2", "--clients", "2"]
    assert gpu_parts.main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["one_device"]["tiles_per_s"] > 0 and out["all_devices"]["tiles_per_s"] > 0
    assert sum(out["all_devices"]["batches_per_worker"].values()) > 0
    timing = out["copy_vs_compute"]
    assert timing["forward_ms"] > 0 and timing["total_ms"] > 0 and 0 <= timing["overlap"] <= 1
    assert out["instances_on_device"] == "accepted"  # CPU instances are allowed
