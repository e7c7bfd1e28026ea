"""The Triton baseline's helpers: process-tree CPU accounting and the goals in the report.

The end-to-end Triton run is checked by ``test_harness.py`` (tiny profile).
"""

from __future__ import annotations

import subprocess
import sys
import time

from bench.load.probes import process_cpu_s
from bench.triton.report import triton_section

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\nprint(1)\n"


def test_server_cpu_includes_live_descendants() -> None:
    # A parent that does nothing but wait on a child burning CPU: the tree's
    # CPU grows by the child's work, the parent alone would not.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURN!r}]); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    try:
        before = process_cpu_s(parent.pid)
        assert before is not None
        deadline = time.monotonic() + 30
        grown = 0.0
        while time.monotonic() < deadline:  # polling another process's counters: no event
            now = process_cpu_s(parent.pid)
            assert now is not None
            grown = now - before
            if grown >= 0.3:
                break
            time.sleep(0.05)
        assert grown >= 0.3, grown
    finally:
        parent.kill()
        parent.wait(10)
    assert process_cpu_s(parent.pid) is None


def _model(pairs: list[dict], check_ok: bool = True) -> dict:
    result = {"max_abs": 1e-6, "min_cosine": 1.0 if check_ok else 0.5, "ok": check_ok}
    return {
        "idle_latency": {},
        "triton": {
            "check": {"histoserve": {"v2-pixels": result}, "triton": {"v2-pixels": result}},
            "settings": {
                "version": "v",
                "max_batch_size": 32,
                "max_queue_delay_ms": 5.0,
                "instances": 1,
            },
            "cells": [],
            "pairs": pairs,
            "unfair": ["note one"],
        },
    }


def _pair(protocol: str, clients: int, tiles: int, ratio: float, p99: tuple[float, float]) -> dict:
    return {
        "protocol": protocol,
        "clients": clients,
        "tiles": tiles,
        "throughput_ratio": ratio,
        "histoserve_tps": 100.0 * ratio,
        "triton_tps": 100.0,
        "histoserve_p99_ms": p99[0],
        "triton_p99_ms": p99[1],
    }


def test_report_judges_the_issue_goals() -> None:
    pairs = [
        _pair("v2-pixels", 64, 1, 1.3, (100.0, 120.0)),  # met
        _pair("v2-grpc", 64, 1, 1.3, (130.0, 120.0)),  # ratio met, p99 worse: missed
        _pair("v2-pixels", 16, 32, 1.2, (10.0, 20.0)),  # under 1.4x: missed
        _pair("v2-grpc", 16, 32, 2.0, (10.0, 20.0)),  # no goal for gRPC many-tile
    ]
    rows = [line for line in triton_section("demo", _model(pairs)) if line.startswith("| v2-")]
    assert len(rows) == 4
    assert rows[0].endswith("**met** |") and "1.30" in rows[0]
    assert rows[1].endswith("**missed** |")
    assert rows[2].endswith("**missed** |") and "≥ 1.4x" in rows[2]
    assert rows[3].endswith("| – | – |")
    assert "- note one" in triton_section("demo", _model(pairs))


def test_report_says_why_triton_was_not_measured() -> None:
    model = _model([])
    model["triton"]["skipped"] = "served embeddings differ"
    text = "\n".join(triton_section("demo", model))
    assert "Triton not measured: served embeddings differ" in text
    assert triton_section("demo", {"idle_latency": {}}) == []
