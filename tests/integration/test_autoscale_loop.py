"""The closed autoscaling loop, short: KEDA on queue depth, one ramp, nothing lost.

Real replicas (the demo package) behind the Service stand-in, real
``histoserve embed`` shards ramping 1 -> 3 -> 1, and the autoscaler stand-in
driven by the chart's rendered ``keda-queue-depth`` preset with its periods
divided by 20 (:mod:`harness.autoscale_loop`). The run fails when a shard
fails, a slide is not done, a file holds fewer tiles than its slide's tissue
grid, or the picture is not written. How fast it scaled is measured, never
asserted (``make autoscale`` writes the figures for every preset).
"""

from __future__ import annotations

from pathlib import Path

from harness.autoscale_loop import LoopConfig, run_loop
from harness.autoscale_report import outputs, write
from tests.integration.autoscale_setup import cohort, rendered_isvc


def test_keda_queue_depth_ramp_loses_no_tile(embedding_package_dir: Path, tmp_path: Path) -> None:
    manifests, expected = cohort(tmp_path / "slides", [3, 9, 3])
    cfg = LoopConfig(
        isvc=rendered_isvc("keda-queue-depth"), package_dir=embedding_package_dir,
        work=tmp_path, manifests=manifests, ramp=(1, 3, 1), time_scale=20.0, cold_start_s=1.0,
    )  # fmt: skip
    result = run_loop(cfg)
    checked = outputs(result, expected)
    found = write(cfg, result, checked, "keda-queue-depth", tmp_path / "results")
    logs = "\n".join(p.read_text(errors="replace")[-1500:] for p in result.shard_logs)
    print({k: found[k] for k in ("phases", "responses_503_retried", "tiles_per_s_by_ready")})
    assert result.shard_codes == [0] * 5, f"shard exit codes {result.shard_codes}:\n{logs}"
    assert checked["failed"] == [] and checked["missing"] == [], checked
    assert checked["done"] == len(expected) and checked["tiles_lost"] == 0, checked
    assert (tmp_path / "results" / "keda-queue-depth.png").stat().st_size > 0
