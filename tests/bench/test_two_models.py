"""The two-models-vs-Triton and reload studies' arithmetic (the servers themselves:
``python -m bench.studies.two_models`` / ``reload``, not run by ``make test``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.studies import reload, two_models


def _cell(server: str, rnd: int, tps: dict[str, float], p99: float = 100.0) -> dict:
    models = {
        name: {"tiles_per_s": v, "p99_ms": p99, "errors": 0, "busy_share": 0.4}
        for name, v in tps.items()
    }
    cores = {"server": 0.9, "clients": 0.1, "other": 0.5 if server == "triton" else 0.25}
    return {
        "server": server,
        "protocol": "v2-pixels",
        "round": rnd,
        "models": models,
        "cores": cores,
    }


def test_ratios_are_per_model_per_round_and_model_work_sums_shares_of_the_limit() -> None:
    cells = [
        _cell("histoserve", 0, {"enc": 200.0, "seg": 20.0}, p99=100.0),
        _cell("triton", 0, {"enc": 100.0, "seg": 20.0}, p99=200.0),
        _cell("triton", 1, {"enc": 100.0, "seg": 40.0}, p99=300.0),
        _cell("histoserve", 1, {"enc": 100.0, "seg": 20.0}, p99=150.0),
    ]
    rows = two_models.summarise(cells, {"enc": 400.0, "seg": 40.0})
    enc, seg, work = rows
    assert enc["model"] == "enc" and enc["throughput_ratio_rounds"] == [2.0, 1.0]
    assert enc["histoserve_tiles_per_s"] == 150.0 and enc["triton_tiles_per_s"] == 100.0
    assert enc["throughput_ratio"] == 1.5
    assert enc["histoserve_p99_ms"] == 125.0 and enc["p99_ratio"] == pytest.approx(0.5)
    assert seg["throughput_ratio_rounds"] == [1.0, 0.5]
    # model work: round 0 H 200/400 + 20/40 = 1.0, T 0.25 + 0.5 = 0.75; round 1 H 0.75, T 1.25
    assert work["model"] == "model work"
    assert work["histoserve_work"] == 0.875 and work["triton_work"] == 1.0
    assert work["throughput_ratio_rounds"] == [pytest.approx(1.333, abs=1e-3), 0.6]
    table = two_models.markdown(rows)
    assert "| v2-pixels | enc | 150.0 | 100.0 | 1.50 (2.00, 1.00) | 125 | 250 | 0.50 |" in table
    assert "server H 0.90 / T 0.90, by everything else on the machine H 0.25 / T 0.50" in table


def test_device_seconds_scale_tritons_per_request_time_by_batches_over_requests() -> None:
    text = "\n".join(
        [
            "# HELP nv_inference_exec_count x",
            'nv_inference_compute_infer_duration_us{model="seg",version="1"} 4000000',
            'nv_inference_exec_count{model="seg",version="1"} 10',
            'nv_inference_request_success{model="seg",version="1"} 40',
            'histoserve_forward_seconds_sum{model="enc"} 1.5',
        ]
    )
    before = {"seg": {"nv_inference_compute_infer_duration_us": 0.0}}
    after = two_models.read_counters(text, two_models.COUNTERS["triton"])
    assert set(after) == {"seg"}
    # 4 s over 40 requests of 10 batches (4 requests each, each counting the batch's 1 s)
    assert two_models.device_seconds("triton", before, after) == {"seg": 1.0}
    mine = two_models.read_counters(text, two_models.COUNTERS["histoserve"])
    assert two_models.device_seconds("histoserve", {}, mine) == {"enc": 1.5}


def test_the_split_threshold_halves_the_logits() -> None:
    threshold = two_models.split_threshold([-0.2, -0.16, -0.1])
    assert threshold == pytest.approx(1 / (1 + 2.718281828**0.16), abs=1e-6)


def test_reload_phases_pair_up_per_arm_and_alternate() -> None:
    order = reload.phase_order(2, ("new", "old"))
    assert order == [
        ("new", "steady"), ("new", "churn"), ("old", "steady"), ("old", "churn"),
        ("old", "churn"), ("old", "steady"), ("new", "churn"), ("new", "steady"),
    ]  # fmt: skip


def _phase(kind: str, p99: float, errors: dict | None = None, loads: int = 0) -> dict:
    calls = [
        {"verb": v, "status": 200, "seconds": 0.5} for _ in range(loads) for v in ("load", "unload")
    ]
    return {
        "phase": kind, "tiles_per_s": 100.0 if kind == "steady" else 80.0, "p50_ms": p99 / 2,
        "p99_ms": p99, "errors": errors or {}, "calls": calls,
    }  # fmt: skip


def test_reload_summary_is_the_ratio_of_median_p99s_and_errors_miss_the_target() -> None:
    phases = [
        _phase("steady", 100.0), _phase("churn", 150.0, loads=3),
        _phase("churn", 250.0, loads=2), _phase("steady", 100.0),
    ]  # fmt: skip
    summary = reload.summarise(phases)
    assert summary["pair_ratios"] == [1.5, 2.5]
    assert summary["p99_ratio"] == 2.0 and summary["target_met"]
    assert summary["churn"]["loads"] == 5 and summary["churn"]["load_s_median"] == 0.5
    assert "target <= 2.0: met" in reload.markdown(summary)
    phases[1]["errors"] = {"503": 1}
    assert not reload.summarise(phases)["target_met"]


def test_the_studies_import_without_starting_anything() -> None:
    code = (
        "import sys, threading; import bench.studies.two_models, bench.studies.reload; "
        "assert threading.active_count() == 1; assert 'torch' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_reload_reads_each_load_step_from_the_server_log_and_health_percentiles() -> None:
    log = "\n".join(
        [
            "INFO loaded /m/a/h0-mini.pt2 (h0-mini) on cpu; start-up phases: digest 9.000s",
            "INFO loaded /m/b/x.pt2 (x) on cpu; start-up phases: digest 0.002s, probe 0.200s",
            "INFO loaded /m/b/x.pt2 (x) on cpu; start-up phases: digest 0.004s, probe 0.100s, "
            "load_probe 3.000s",
            "INFO loaded /m/b/x.pt2 (x) on cpu; start-up phases: digest 0.006s, probe 0.300s",
        ]
    )
    log = log.replace("/m/", "/tmp/r/models/")
    assert reload.load_phases(log) == {"digest": 0.004, "probe": 0.2, "load_probe": 3.0}
    assert reload.latency_ms([0.001] * 99 + [0.5]) == {
        "p50_ms": 1.0,
        "p99_ms": 500.0,
        "max_ms": 500.0,
    }
    assert reload.latency_ms([])["p99_ms"] is None


def test_reload_sums_py_spys_raw_samples_by_innermost_frames() -> None:
    raw = "\n".join(
        [
            "thread (1): MainThread;run (a.py:1);forward (b.py:2);call (c.py:3);native (d.py:4) 7",
            "thread (2): batcher;run (a.py:1);forward (b.py:2);call (c.py:3);native (d.py:4) 3",
            "thread (3): load;load (l.py:1);probe (p.py:2) 5",
            "garbage line",
        ]
    )
    got = reload.summarise_raw(raw, 800)
    assert got["samples"] == 15 and got["possible"] == 800
    assert got["top_frames"] == {"forward;call;native": 10, "load;probe": 5}
