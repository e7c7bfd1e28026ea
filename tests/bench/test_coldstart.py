"""bench/stages/coldstart.py: the split of a start, its report, and one real cold start of the tiny package."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.stages import coldstart
from bench.stages.coldstart import ColdStartConfig, parse_anchors, section, split_start, summarise
from harness.packages import package_in

SERVED = {"digest": 0.5, "metadata": 0.01, "extraction": 0.7, "load": 0.2, "probe": 1.0}


def test_a_start_splits_into_parts_that_add_up_to_its_total() -> None:
    parts = split_start(100.0, 110.0, (102.0, 109.5), {**SERVED, "warmup": 0.09})
    assert parts["total"] == pytest.approx(10.0)
    assert parts["imports"] == pytest.approx(2.0)
    assert parts["server_start"] == pytest.approx(0.5)
    assert parts["other"] == pytest.approx(7.5 - 2.5)
    assert sum(parts[k] for k in coldstart.PARTS) == pytest.approx(parts["total"])


def test_a_phase_the_server_lacks_counts_zero() -> None:
    """torch's loader has no extraction phase: its load includes it."""
    served = {k: v for k, v in SERVED.items() if k != "extraction"}
    parts = split_start(0.0, 3.0, (1.0, 2.9), served)
    assert parts["extraction"] == 0.0
    assert sum(parts[k] for k in coldstart.PARTS) == pytest.approx(3.0)


def test_clocks_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="out of order"):
        split_start(5.0, 9.0, (4.0, 8.0), SERVED)  # began before the process started
    with pytest.raises(ValueError, match="out of order"):
        split_start(0.0, 2.0, (1.0, 3.0), SERVED)  # built after ready


def test_anchors_are_parsed_and_missing_lines_named() -> None:
    log = (
        "2026 INFO histoserve: start-up begins at monotonic 12.500000 s\n"
        "... loaded ...\n"
        "2026 INFO histoserve: model built at monotonic 14.250000 s\n"
    )
    assert parse_anchors(log) == (12.5, 14.25)
    with pytest.raises(ValueError, match="model built"):
        parse_anchors(log.splitlines()[0])


def test_summary_is_the_median_per_part_and_the_totals_range() -> None:
    runs = [
        split_start(0.0, total, (1.0, total - 0.1), SERVED) | {"other_cores": cores}
        for total, cores in ((5.0, 0.1), (7.0, 0.9), (6.0, 0.5))
    ]
    s = summarise(runs)
    assert s["total"] == 6.0 and s["total_range"] == [5.0, 7.0] and s["runs"] == 3
    assert s["other_cores"] == 0.5 and s["digest"] == 0.5
    assert "server_cores" not in s  # not in every run


def _result(runner: str) -> dict:
    parts = split_start(0.0, 4.0, (1.5, 3.8), SERVED)
    return {
        "package_mb": 2176.4,
        "config": {"forward_runner": runner},
        "read_once_s": {"warm": 0.8, "dropped": 1.9},
        "starts": {"warm": summarise([parts]), "dropped": summarise([parts])},
    }


def test_section_has_a_row_per_model_and_cache_state() -> None:
    lines = section({"vit-g": _result("gil_free"), "vit-s": _result("torch")})
    rows = [line for line in lines if line.startswith("| vit-")]
    assert len(rows) == 4
    assert rows[0].startswith("| vit-g | 2176 | warm | 0.800 | 4.00 (4.00–4.00) | 1.500 | 0.500 ")
    assert "| 0.700 |" in rows[0]  # the GIL-free runner's extraction
    assert "| – | 0.200 |" in rows[2]  # torch's loader: load includes extraction
    assert section(None) == []


def test_config_validates_its_values() -> None:
    with pytest.raises(ValueError, match="runs must be >= 1, got 0"):
        ColdStartConfig(runs=0)
    with pytest.raises(ValueError, match="poll_s"):
        ColdStartConfig(poll_s=0)


def test_a_file_is_read_once_with_its_pages_dropped(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"x" * (3 << 20))
    assert coldstart.drop_page_cache(path)
    assert coldstart.read_once_s(path, drop=True) > 0
    assert path.read_bytes() == b"x" * (3 << 20)  # dropping the cache never touches the file


def test_one_real_cold_start_of_the_tiny_package(
    embedding_package_dir: Path, tmp_path: Path
) -> None:
    """A real ``python -m predictor`` per start, warm and dropped, split and summarised."""
    package = package_in(embedding_package_dir)
    cfg = ColdStartConfig(runs=1, threads=2, timeout_s=180.0)
    result = coldstart.measure_package(package, cfg, tmp_path / "logs", log=lambda _m: None)
    assert set(result["starts"]) == {"warm", "dropped"}
    assert result["package_mb"] == pytest.approx(package.stat().st_size / 2**20)
    for state, summary in result["starts"].items():
        (run,) = result["raw"][state]
        assert sum(run[k] for k in coldstart.PARTS) == pytest.approx(run["total"], abs=1e-6)
        assert run["imports"] > 0.2  # a Python interpreter importing torch and KServe
        for phase in ("digest", "extraction", "load", "probe"):
            assert run[phase] > 0, (state, phase, run)  # the GIL-free runner reports extraction
        assert 0 < run["server_start"] < run["total"]
        assert summary["total"] == run["total"] and 0 < summary["server_cores"] <= 2.5
        assert result["read_once_s"][state] > 0
    assert len(section({"demo": result})) == 9


def test_the_profiles_cold_start_their_big_packages() -> None:
    from bench.profiles import PROFILES

    assert [c.label for c in coldstart.cases_for(PROFILES["tiny"])] == ["demo"]
    assert [c.label for c in coldstart.cases_for(PROFILES["full"])] == ["vit-s", "vit-g"]
    assert [c.label for c in coldstart.cases_for(PROFILES["gpu"])] == ["vit-g"]
    assert coldstart.VIT_G.dtype == "bf16"
