"""The serving GC policy: start-up heap frozen, young generation collected less often."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from predictor.server.gc_policy import GcPolicy

PROBE = """
import gc, json
from predictor.server.gc_policy import GcPolicy, apply
import torch  # a heap the size of the server's start-up one
before = gc.get_threshold()
applied = apply(GcPolicy(gen0_threshold=12345))
young = [[i] for i in range(100)]  # allocated after the freeze: not frozen
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                  "gen0": applied.gen0_threshold}))
"""


def test_apply_freezes_the_startup_heap_and_sets_the_thresholds() -> None:
    # A fresh interpreter: applying the policy here would change the test process's collector.
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] == [700, 10, 10]
    assert got["after"] == [12345, 10, 10]
    assert got["gen0"] == 12345
    assert got["frozen"] > 50_000  # torch alone is hundreds of thousands of objects


@pytest.mark.parametrize("field", ["gen0_threshold", "gen1_threshold", "gen2_threshold"])
@pytest.mark.parametrize("value", [0, -5, 2.5])
def test_policy_refuses_bad_thresholds(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"GcPolicy\.{field} must be a positive int, got {value}"):
        GcPolicy(**{field: value})
