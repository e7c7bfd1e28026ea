"""QC pictures, GeoJSON and facts on a real generated slide, and the run report built from them."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.slides import GeneratedSlide
from histoserve.results.status import StatusLog
from histoserve.review.qc import read_facts, write_slide_qc
from histoserve.review.report import collect_rows, write_report
from histoserve.slides.grid import plan_tiles
from histoserve.slides.readers import SlideReader, resolve_mpp
from histoserve.tissue.masks import find_tissue, read_geojson

GREEN, RED = np.array([0, 200, 0]), np.array([230, 20, 20])


def _qc(slide: GeneratedSlide, out: Path, slide_id: str, target: float = 0.5, n_bad: int = 0):
    with SlideReader.open(slide.path) as reader:
        mpp = resolve_mpp(reader, None, None, 0.05)
        plan = plan_tiles(reader, mpp, target, 224, 0.05)
        tissue = find_tissue(reader, mpp, plan, "otsu")
    kept = plan.coords[tissue.fractions >= 0.25]
    thumb = (tissue.thumb, tissue.thumb_mpp)
    return write_slide_qc(out, slide_id, thumb, plan, tissue, kept, kept[:n_bad]), plan, tissue


def _near(picture: np.ndarray, colour: np.ndarray, tol: int = 40) -> np.ndarray:
    return (np.abs(picture.astype(int) - colour) < tol).all(axis=2)


def test_picture_geojson_and_facts(svs_slide: GeneratedSlide, tmp_path: Path) -> None:
    facts, _plan, tissue = _qc(svs_slide, tmp_path, "S1", n_bad=2)
    with Image.open(tmp_path / "qc" / "S1.jpg") as image:
        picture = np.asarray(image.convert("RGB"))
    assert max(picture.shape[:2]) >= 1000  # a 224 px thumbnail is drawn large enough to read
    assert _near(picture, GREEN).sum() > 500  # contours
    assert _near(picture, RED).sum() > 100  # the two unreadable tiles
    include, exclude = read_geojson(tmp_path / "qc" / "S1.geojson")
    assert len(include) == len(tissue.polygons_level0(0.25)) >= 2 and exclude == []
    xs = np.array([x for polygon in include for x, _ in polygon[0]])
    box_x = [b[0] for b in svs_slide.boxes] + [b[0] + b[2] for b in svs_slide.boxes]
    assert xs.min() >= min(box_x) and xs.max() <= max(box_x)  # level-0 pixels
    assert facts == read_facts(tmp_path)["S1"]
    assert facts["n_kept"] == 8 and facts["n_bad"] == 2 and facts["read_level"] == 1
    assert facts["mpp_source"] and 0.05 < facts["tissue_area_mm2"] < 0.13  # boxes: 0.125 mm²


def test_report_lists_every_slide_suspicious_first(
    svs_slide: GeneratedSlide, blank_slide: GeneratedSlide, tmp_path: Path
) -> None:
    _qc(svs_slide, tmp_path, "clean")
    _qc(svs_slide, tmp_path, "resized", target=0.6)
    _qc(blank_slide, tmp_path, "blank")
    _qc(svs_slide, tmp_path, "holes", n_bad=1)
    log = StatusLog(tmp_path)
    for slide_id in ("clean", "resized", "blank"):
        log.append(slide_id, f"/s/{slide_id}.svs", "done", 3, 1.5)
    log.append("holes", "/s/holes.svs", "failed", 9, 2.0, "1 of 10 tiles unreadable")
    log.append("gone", "/s/gone.svs", "failed", 0, 0.1, "cannot open")
    log.append("clean", "/s/clean.svs", "skipped", 0, 0.0, "already done")
    rows = collect_rows(tmp_path)
    assert [r.slide_id for r in rows] == ["gone", "holes", "blank", "clean", "resized"]
    assert rows[0].flags == ["failed"] and rows[2].flags == ["no tissue"]
    assert "resized" in rows[4].flags and rows[3].status["status"] == "done"
    page = write_report(tmp_path).read_text()
    for slide_id in ("gone", "holes", "blank", "clean", "resized"):
        assert f"<td>{slide_id}<br>" in page
    assert page.count('<img src="qc/') == 4  # "gone" failed before its plan: no picture
    assert "cannot open" in page and "1 of 10 tiles unreadable" in page
    assert "538 → 224 px (resized)" not in page and "269 → 224 px (resized)" in page
    assert json.loads((tmp_path / "qc" / "blank.geojson").read_text())["features"] == []


def test_malformed_facts_and_status_lines_are_left_out_with_one_warning_each(
    svs_slide: GeneratedSlide, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One bad file in ``--out`` crashed every run's report with a TypeError before."""
    _qc(svs_slide, tmp_path, "good")
    qc = tmp_path / "qc"
    facts = json.loads((qc / "good.json").read_text())
    (qc / "typed.json").write_text(
        json.dumps({**facts, "slide_id": "old", "tissue_area_mm2": "2.0"})
    )
    (qc / "nan.json").write_text(json.dumps({**facts, "slide_id": "nan", "level0_mpp": None}))
    (qc / "list.json").write_text("[1, 2]")
    (qc / "half.json").write_text('{"slide_id": "half", "n_')
    (qc / "deep.json").write_text("[" * 1000 + "]" * 1000)  # a RecursionError, no report before
    os.mkfifo(qc / "fifo.json")  # never opened blocking
    (qc / "link.json").symlink_to(qc / "good.json")
    log = StatusLog(tmp_path)
    log.append("good", "/s/good.svs", "done", 3, 1.5)
    with open(tmp_path / "status.csv", "a", encoding="utf-8") as handle:
        handle.write("B\n,,,,,\nC,/s/c.svs,weird,1,1.0,\nD,/s/d.svs,done,1,1.0,,extra\n")
    log.append("after", "/s/after.svs", "failed", 0, 0.1, "cannot open")
    with caplog.at_level(logging.WARNING, logger="histoserve.embed"):
        page = write_report(tmp_path).read_text()
    warnings = [r.getMessage() for r in caplog.records]
    assert [r.slide_id for r in collect_rows(tmp_path)] == ["after", "good"]
    assert "<td>good<br>" in page and "<td>after<br>" in page and "<td>old<br>" not in page
    for name in ("typed", "nan", "list", "half", "deep", "fifo", "link"):
        assert sum(f"qc/{name}.json left out of the report" in w for w in warnings) == 1
    assert any('tissue_area_mm2 is "2.0", not float' in w for w in warnings)
    assert any("FIFO" in w for w in warnings)
    assert any("deep.json is JSON nested 1000 deep" in w for w in warnings)
    assert any(
        "status.csv: 4 malformed lines left out of the report (line 3, 4, 5, 6)" in w
        for w in warnings
    )
