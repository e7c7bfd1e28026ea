"""The ``make bench`` stage for issue 35: every reader, resize and transport in one real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.markdown import table
from bench.stages import jpeg_transport
from bench.studies import native_reader


@pytest.fixture(scope="module")
def stage() -> dict:
    return jpeg_transport.stage(repeats=1, edge=1792)  # 16 model tiles a slide


def test_the_stage_measures_every_path_on_both_slides_against_today(stage: dict) -> None:
    rows = {(r["slide"], r["reader"], r["resize"], r["transport"]): r for r in stage["rows"]}
    assert set(rows) == {
        ("A", "openslide", "bicubic", "pixels"),
        ("A", "native", "bicubic", "pixels"),
        ("A", "native", "area", "pixels"),
        ("A", "native", "reduced", "pixels"),
        ("A", "native", "bicubic", "jpeg"),
        ("B", "openslide", "none", "pixels"),
        ("B", "native", "none", "pixels"),
        ("B", "native", "none", "jpeg"),
    }
    for (slide, reader, _, transport), r in rows.items():
        today = rows[(slide, "openslide", "bicubic" if slide == "A" else "none", "pixels")]
        assert r["tiles"] == 16
        assert r["client_cpu_vs_today"] == pytest.approx(
            r["client_cpu_ms_per_tile"] / today["client_cpu_ms_per_tile"]
        )
        assert r["tiles_per_s_per_core"] == pytest.approx(1000 / r["client_cpu_ms_per_tile"])
        assert r["bytes_vs_raw"] == pytest.approx(r["bytes_per_tile"] / today["bytes_per_tile"])
        assert (r["server_cpu_ms_per_tile"] > 0) == (transport == "jpeg")
        assert (r["goal_client_ms"] is None) == (reader == "openslide")
    assert rows[("B", "native", "none", "jpeg")]["bytes_vs_raw"] < 1 / 3
    assert rows[("A", "native", "bicubic", "pixels")]["bytes_vs_raw"] == 1


def test_the_stage_renders_one_row_per_path_and_writes_its_files(
    stage: dict, tmp_path: Path
) -> None:
    lines = jpeg_transport.section(stage)
    assert lines[0] == "## Slide reading and transport (issue 35)"
    assert sum(line.startswith(("| A |", "| B |")) for line in lines) == len(stage["rows"]) == 8
    assert jpeg_transport.section(None) == []
    jpeg_transport.write(stage, tmp_path)
    assert json.loads((tmp_path / "slide_reading.json").read_text()) == stage
    assert (tmp_path / "slide_reading.md").read_text().startswith("## Slide reading")


def test_both_benchmark_tables_share_one_markdown_helper() -> None:
    assert table(("slide", "path", "ms"), [("A", "x", 1.234), ("B", "y", None)]) == [
        "| slide | path | ms |",
        "| --- | --- | ---: |",
        "| A | x | 1.23 |",
        "| B | y | – |",
    ]
    row = {
        "slide": "A",
        "reader": "native",
        "resize": "area",
        "cpu_ms_per_tile": 1.5,
        "cosine_to_bicubic": 0.9998,
        "psnr_to_bicubic_db": float("inf"),
    }
    assert native_reader.markdown([row]).splitlines()[2] == (
        "| A | native + area | 1.50 | 0.99980 | identical |"
    )
