"""The closed autoscaling loop for every scaling preset of the chart (``make autoscale``, slow).

Each preset (``charts/histoserve/presets``) is rendered by the real helm and
drives :mod:`harness.autoscale_loop` through a ramp of 1 -> 4 -> 1 real
``histoserve embed`` shards, then a settle period that shows the scale-in;
periods divided by ``HISTOSERVE_AUTOSCALE_SCALE`` (default 20). Figures
(``<preset>.json``) and plots (``<preset>.png``) go to
``$HISTOSERVE_AUTOSCALE_OUT`` (default ``bench/results/autoscale``); the
numbers in ``docs/deployment.md`` come from there. Fails when a slide fails
or a tile is lost. The hpa-cpu preset runs with a 1-CPU request (the chart's
4 would never be reached by one replica on a 2-core machine).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.autoscale_loop import LoopConfig, run_loop
from harness.autoscale_report import outputs, write
from tests.chart.helpers import REPO
from tests.integration.autoscale_setup import cohort, rendered_isvc

PRESETS = {
    "keda-queue-depth": {},
    "hpa-cpu": {"resources.requests.cpu": "1"},
    "knative-scale-to-zero": {},
}


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_closed_loop(preset: str, embedding_package_dir: Path, tmp_path: Path) -> None:
    scale = float(os.environ.get("HISTOSERVE_AUTOSCALE_SCALE", "20"))
    out = Path(os.environ.get("HISTOSERVE_AUTOSCALE_OUT", REPO / "bench" / "results" / "autoscale"))
    manifests, expected = cohort(tmp_path / "slides", [4, 48, 48])
    cfg = LoopConfig(
        isvc=rendered_isvc(preset, PRESETS[preset]), package_dir=embedding_package_dir,
        work=tmp_path, manifests=manifests, ramp=(1, 4, 1), time_scale=scale, cold_start_s=2.0,
    )  # fmt: skip
    result = run_loop(cfg, settle_s=600.0 / scale)
    checked = outputs(result, expected)
    found = write(cfg, result, checked, preset, out)
    print(preset, found["phases"], found["responses_503_retried"], found["tiles_per_s_by_ready"])
    assert result.shard_codes == [0] * 6, result.shard_codes
    assert checked["failed"] == [] and checked["missing"] == [], checked
    assert checked["tiles_lost"] == 0, checked
