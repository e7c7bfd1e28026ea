"""The serving GC policy: the start-up heap frozen, CPython's thresholds kept, no knobs."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

from predictor.http import gc_policy

PROBE = """
import gc, json
from predictor.http.gc_policy import apply
import torch  # a heap the size of the server's start-up one
before = gc.get_threshold()
frozen = apply()
young = [[i] for i in range(100)]  # allocated after the freeze: not frozen
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                  "returned": frozen}))
"""


def test_apply_freezes_the_startup_heap_and_keeps_the_thresholds() -> None:
    # A fresh interpreter: applying the policy here would change the test process's collector.
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] == got["after"] == [700, 10, 10]
    assert got["frozen"] == got["returned"] > 50_000  # torch alone: hundreds of thousands


def test_the_policy_has_no_knobs_nobody_sets() -> None:
    """The CLI calls ``apply()`` bare; thresholds no caller set were removed."""
    assert not hasattr(gc_policy, "GcPolicy")
    assert inspect.signature(gc_policy.apply).parameters == {}
