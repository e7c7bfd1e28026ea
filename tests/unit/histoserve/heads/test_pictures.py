"""The heatmap and the QuPath GeoJSON of a slide head's attention."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.slide_server import CLASSES, SlideServer
from histoserve.heads import heatmap
from histoserve.heads.aggregate import AggregateConfig, aggregate
from histoserve.heads.table import read_table, write_table
from tests.unit.histoserve.heads import features as ff


def test_percentiles_rank_and_share_ties() -> None:
    got = heatmap.percentiles(np.array([0.5, 0.1, 0.1, 0.9, 0.2]))
    np.testing.assert_allclose(got, [0.75, 0.125, 0.125, 1.0, 0.5])
    assert heatmap.percentiles(np.array([3.0])).tolist() == [1.0]


def test_overlapping_tiles_are_averaged() -> None:
    boxes = np.array([[0, 0, 4, 4], [2, 0, 6, 4]])  # overlapping in columns 2-3
    mean, count = heatmap.tile_average(np.array([1.0, 0.0]), boxes, (4, 8))
    assert mean[0].tolist() == [1, 1, 0.5, 0.5, 0, 0, 0, 0]
    assert count[0].tolist() == [1, 1, 2, 2, 1, 1, 0, 0]


def test_a_nearly_flat_attention_is_said_with_its_raw_range() -> None:
    """Issue 33, case 6: 0.0998-0.1004 drawn from full purple to full yellow said nothing."""
    rng = np.random.default_rng(0)
    flat, spiky = 0.0998 + rng.random(80) * 0.0006, rng.dirichlet(np.full(80, 0.3))
    low, high, warning = heatmap.range_note(flat)
    assert (low, high) == (f"{flat.min():.4g}", f"{flat.max():.4g}")
    assert warning.startswith("attention nearly flat") and "0.6% apart" in warning
    assert heatmap.range_note(spiky)[2] == "" and heatmap.range_note(np.array([0.3]))[2] == ""
    coords = np.array([(x * 224, y * 224) for y in range(8) for x in range(10)])

    def red_in_title(attention: np.ndarray) -> int:
        picture = heatmap.render_heatmap(None, (2240, 1792), coords, 224, attention, "S1", "p")
        top = np.asarray(picture)[:90].astype(int)
        return int(np.sum((top[..., 0] > 150) & (top[..., 1] < 60) & (top[..., 2] < 60)))

    assert red_in_title(flat) > 200 and red_in_title(spiky) == 0


def test_viridis_runs_dark_to_bright() -> None:
    lut = heatmap.viridis().astype(int)
    assert (
        lut.shape == (256, 3) and tuple(lut[0]) == (68, 1, 84) and tuple(lut[-1]) == (253, 231, 37)
    )
    assert np.all(np.diff(lut.sum(axis=1)[::16]) > 0)  # brighter all the way up


def _read_as_qupath(path: Path) -> list[dict]:
    """Detections as QuPath's GeoJSON reader takes them: Features whose properties say
    ``objectType: detection``, one closed Polygon ring, ``measurements`` a map of finite numbers."""
    collection = json.loads(path.read_text(encoding="utf-8"), parse_constant=pytest.fail)
    assert collection["type"] == "FeatureCollection"
    found = []
    for feature in collection["features"]:
        assert feature["type"] == "Feature"
        props, geometry = feature["properties"], feature["geometry"]
        assert props["objectType"] == "detection" and geometry["type"] == "Polygon"
        (ring,) = geometry["coordinates"]
        assert ring[0] == ring[-1] and len(ring) == 5
        measurements = props["measurements"]
        assert isinstance(measurements, dict)
        assert all(isinstance(v, float) and math.isfinite(v) for v in measurements.values())
        found.append({"ring": ring, "measurements": measurements})
    return found


@pytest.mark.parametrize("branches", [False, True])
def test_the_geojson_reads_back_as_qupath_detections_with_measurements(
    tmp_path: Path, branches: bool
) -> None:
    coords = ff.tissue_coords(60)
    features = ff.features_for(coords)
    ff.write("flat", tmp_path, "S0", features, coords)
    with SlideServer("abmil-demo", ff.D, branches=branches) as s:
        assert aggregate(AggregateConfig(tmp_path, (s.url,), "abmil-demo")).done == ["S0"]
        attention = s.expected(features)["attention"].reshape(len(coords), -1)
    found = _read_as_qupath(tmp_path / "qc" / "S0.abmil-demo.geojson")
    names = ["attention"] if not branches else [f"attention: {c}" for c in CLASSES]
    assert len(found) == len(coords)
    for detection, (x, y), row in zip(found, coords.tolist(), attention, strict=True):
        assert detection["ring"][0] == [x, y] and detection["ring"][2] == [
            x + ff.PATCH,
            y + ff.PATCH,
        ]
        m = detection["measurements"]
        assert sorted(m) == sorted([*names, "attention percentile"])
        assert [m[n] for n in names] == pytest.approx(row.tolist(), rel=1e-6)
    picture = Image.open(tmp_path / "qc" / "S0.abmil-demo.heatmap.jpg")
    assert picture.format == "JPEG" and picture.width >= 1200


def test_slides_csv_neutralises_formulas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.slide_server as fake

    monkeypatch.setattr(fake, "CLASSES", ("=HYPERLINK(1)", "ok"))
    coords = ff.tissue_coords(20)
    ff.write("flat", tmp_path, "S0", ff.features_for(coords), coords)
    with SlideServer("abmil-demo", ff.D) as s:
        aggregate(AggregateConfig(tmp_path, (s.url,), "abmil-demo"))
    text = (tmp_path / "slides.csv").read_text()
    assert "'=HYPERLINK(1)" in text.splitlines()[0]
    assert "=HYPERLINK(1)" in read_table(tmp_path)[0]
    write_table(tmp_path, [tmp_path])  # rebuilding gives the same table
    assert (tmp_path / "slides.csv").read_text() == text


def test_slides_csv_writes_predictions_as_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A negative prediction is -0.5, not the text '-0.5 (pandas read such a column as strings)."""
    import csv

    from histoserve.heads import table

    row = {"slide_id": "-S1", "model": "m", "package_sha256": "", "tile_model": "", "p": "-0.5"}
    monkeypatch.setattr(table, "collect_rows", lambda _roots: (["p", "q"], [row]))
    write_table(tmp_path, [tmp_path])
    (cells,) = list(csv.DictReader((tmp_path / "slides.csv").open()))
    assert cells["p"] == "-0.5" and float(cells["p"]) == -0.5 and cells["q"] == ""
    assert cells["slide_id"] == "'-S1"  # text that could start a formula stays escaped
    assert read_table(tmp_path)[0]["slide_id"] == "-S1"
