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
from histoserve.heads.background import verified_slide
from histoserve.heads.table import read_table, write_table
from histoserve.results.sources import read_features
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


def _features_of(slide: Path, out: Path, slide_id: str, given_as: str) -> np.ndarray:
    """A features file as ``embed`` writes it for ``slide`` (given to it as ``given_as``)."""
    import h5py

    from histoserve.slides.identity import slide_identity

    coords = np.array([(x, y) for y in (448, 896) for x in (448, 896, 1344)], np.int64)
    ff.write("flat", out, slide_id, ff.features_for(coords), coords)
    with h5py.File(out / f"{slide_id}.h5", "r+") as f:
        f.attrs.update(
            level0_width=3584, level0_height=2688, patch_size_level0=448, level0_mpp=0.25,
            slide_path=given_as, slide_identity=slide_identity(slide).to_attr(),
        )  # fmt: skip
    return coords


def _top_crop_brightness(out: Path, slide_id: str) -> float:
    sheet = np.asarray(Image.open(out / "qc" / f"{slide_id}.abmil-demo.top.jpg").convert("L"))
    return float(sheet[40:250, 10:230].mean())  # the first crop (8, 34) + 224 px


def test_pictures_draw_the_slide_the_features_were_made_from_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33, case 1: aggregate run elsewhere opened another slide by the relative path."""
    from harness import slides

    lab, elsewhere = tmp_path / "lab", tmp_path / "other"
    mine = slides.aperio_svs(lab / "slides" / "S1.svs").path  # tissue under the tiles
    glass = slides.SlideSpec(width=3584, height=2688, boxes=())
    slides.write_slide(elsewhere / "slides" / "S1.svs", glass)  # the same relative path
    first, second = tmp_path / "first", tmp_path / "second"
    for out in (first, second):
        _features_of(mine, out, "S1", "slides/S1.svs")  # embed ran in lab/
    monkeypatch.chdir(elsewhere)
    with SlideServer("abmil-demo", ff.D) as s:
        assert aggregate(AggregateConfig(first, (s.url,), "abmil-demo")).done == ["S1"]
        assert _top_crop_brightness(first, "S1") < 215  # tissue: the lab's slide, not the glass
        slides.write_slide(mine, glass)  # the lab's slide replaced since the features were made
        assert aggregate(AggregateConfig(second, (s.url,), "abmil-demo")).done == ["S1"]
    assert (second / "qc" / "S1.abmil-demo.heatmap.jpg").is_file()
    assert not (second / "qc" / "S1.abmil-demo.top.jpg").exists()  # no crops of another slide
    path, why = verified_slide(read_features(second / "S1.h5"))
    assert path is None and why == "S1.svs is not the slide the features were made from"
