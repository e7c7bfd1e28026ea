"""``bench.stages.instances``: histoserve and Triton, two instances each, on the tiny profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.matrix.cells import LoadClient
from bench.profiles import PROFILES
from bench.run import measure_instances
from bench.stages import instances
from bench.triton import baseline


@pytest.mark.integration
def test_two_instance_pairs_run_and_render(tmp_path: Path) -> None:
    profile = PROFILES["tiny"]
    if not baseline.available():  # `make bench` creates .venv-triton; without it: no comparison
        assert measure_instances(profile, tmp_path, print) is None
        return
    client = LoadClient()
    try:
        part = instances.measure(profile, client, tmp_path, print, rounds=1)
    finally:
        client.close()
    assert all(r["ok"] for s in ("histoserve", "triton") for r in part["check"][s].values())
    assert {(p["protocol"], p["clients"], p["tiles"]) for p in part["pairs"]} == {
        (proto, c, t) for proto in instances.PROTOCOLS for c, t in instances.CELLS
    }
    for pair in part["pairs"]:
        assert pair["throughput_ratio"] > 0
        for cell in pair["cells"].values():
            assert cell["throughput"] > 0 and not cell["errors"], cell
    hs_log = next(tmp_path.glob("histoserve-x2-*.log")).read_text()
    assert "cpu#0" in hs_log and "cpu#1" in hs_log  # two device workers really served
    lines = instances.section(part)
    assert lines[0].startswith("## demo: histoserve vs Triton, 2 instances")
    assert sum(line.startswith("| 0 |") for line in lines) == len(part["pairs"])
