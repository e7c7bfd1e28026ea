"""The ``make bench`` stage for issue 12's CPU worker figures: real runs, short windows."""

from __future__ import annotations

from bench.stages import gil, workers


def test_workers_stage_measures_both_paths_and_renders() -> None:
    out = workers.measure(seconds=0.3, batch=2, clients=2)
    for name in ("torch_loader", "gil_free_runner"):
        run = out[name]
        assert run["one_worker"]["tiles_per_s"] > 0
        assert run["two_workers"]["tiles_per_s"] > 0
        assert run["ratio"] == run["two_workers"]["tiles_per_s"] / run["one_worker"]["tiles_per_s"]
    lines = workers.section(out)
    assert lines[0].startswith("## Two device workers")
    assert sum(line.startswith("| gil_free_runner |") for line in lines) == 1
    assert workers.section(None) == []


def test_gil_stage_measures_loop_progress_and_renders() -> None:
    out = gil.run(["--batch", "4", "--forwards", "2"])
    for name in ("torch_loader", "gil_free_runner"):
        assert out[name]["forward_ms"] > 0
        assert out[name]["progress"] >= 0.0
    # The GIL-free runner lets the loop run during a forward; torch's loader does not.
    assert out["gil_free_runner"]["progress"] > out["torch_loader"]["progress"]
    lines = gil.section(out)
    assert any(line.startswith("| torch_loader |") for line in lines)
    assert gil.section(None) == []
