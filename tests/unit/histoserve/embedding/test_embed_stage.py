"""``histoserve embed --slide-model``: the slide head once the tiles are done, the same numbers
as ``histoserve aggregate``, and the report showing both.

Both servers are loopback FAKES (:class:`harness.bad_server.BadServer` answering tiles from
their pixels, :class:`harness.slide_server.SlideServer` a numpy ABMIL): the slide is a real
generated pyramidal TIFF, the client and its files are real.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from harness import slides
from harness.bad_server import BadServer
from harness.slide_server import CLASSES, SlideServer
from histoserve.commands.embed import main as embed_main
from histoserve.embedding.config import EmbedConfig
from histoserve.embedding.pipeline import embed
from histoserve.heads.aggregate import AggregateConfig, aggregate
from histoserve.heads.pictures import picture_files
from histoserve.heads.table import read_table
from histoserve.results.sources import find_sources, read_features
from tests.unit.histoserve.heads.features import TILE_CONFIG

DIM = TILE_CONFIG["outputs"][0]["shape"][1]


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return slides.generic_tiff(tmp_path_factory.mktemp("wsi") / "W1.tiff").path


@pytest.fixture(scope="module")
def servers():
    tiles = BadServer(config=TILE_CONFIG, source="pixels", dim=DIM)
    with tiles, SlideServer("abmil-demo", DIM) as head:
        yield tiles, head


def _embed(out: Path, slide: Path, servers, layout: str, **kw) -> object:
    tiles, head = servers
    config = EmbedConfig(
        urls=(tiles.url,), out_dir=out, slides=(slide,), model="h0-mini", layout=layout,
        tissue="none", progress="none", slide_model="abmil-demo", slide_urls=(head.url,), **kw,
    )  # fmt: skip
    return embed(config)


def _slide_result(out: Path) -> dict[str, np.ndarray]:
    (path,) = [p for p in out.rglob("slide_features_abmil-demo/*.h5")]
    with h5py.File(path) as f:
        return {k: f[k][()] for k in ("prediction", "attention", "features", "coords")}


@pytest.mark.parametrize("layout", ["flat", "trident", "clam"])
def test_slide_model_after_the_tiles_equals_aggregate(
    tmp_path: Path, slide: Path, servers, layout: str
) -> None:
    summary = _embed(tmp_path, slide, servers, layout)
    assert summary.done == ["W1"] and not summary.failed
    first = _slide_result(tmp_path)
    (source,) = find_sources(tmp_path, layout)
    want = servers[1].expected(read_features(source.path).features)
    np.testing.assert_allclose(first["prediction"], want["prediction"], rtol=1e-6)
    assert first["attention"].shape == (len(first["coords"]),) and len(first["coords"]) > 50
    again = aggregate(AggregateConfig(tmp_path, (servers[1].url,), "abmil-demo", force=True))
    assert again.done == ["W1"]
    for name, values in _slide_result(tmp_path).items():
        np.testing.assert_array_equal(values, first[name])
    (row,) = read_table(tmp_path)
    assert float(row[CLASSES[0]]) == pytest.approx(float(want["prediction"][0]), rel=1e-5)
    report = (tmp_path / "report.html").read_text()
    pictures = picture_files(tmp_path, "W1", "abmil-demo", row["tiling"])
    assert row["tiling"] == ("20x_224px_0px_overlap" if layout == "trident" else "")
    assert f"qc/{pictures.heatmap.name}" in report and "QuPath GeoJSON" in report
    assert pictures.heatmap.is_file()
    top = Image.open(pictures.top)  # the slide is readable here
    assert top.height > 224 and top.width >= 8 * 224


def test_a_rerun_skips_the_tiles_and_runs_a_missing_head(
    tmp_path: Path, slide: Path, servers
) -> None:
    _embed(tmp_path, slide, servers, "flat")
    for path in tmp_path.rglob("slide_features_abmil-demo/*.h5"):
        path.unlink()
    summary = _embed(tmp_path, slide, servers, "flat")
    assert summary.skipped == ["W1"] and not summary.failed
    assert _slide_result(tmp_path)["prediction"].shape == (len(CLASSES),)


def test_a_failing_head_fails_the_slide_and_keeps_its_tiles(
    tmp_path: Path, slide: Path, servers
) -> None:
    tiles, _ = servers
    with SlideServer("abmil-demo", DIM, tamper="400") as bad:
        summary = _embed(tmp_path, slide, (tiles, bad), "flat", max_attempts=1)
    assert not summary.done and "slide model abmil-demo" in summary.failed["W1"]
    assert "refused" in summary.failed["W1"] and (tmp_path / "W1.h5").is_file()


def test_a_tile_model_as_slide_model_is_a_usage_error_before_any_slide(
    tmp_path: Path, slide: Path, servers, capsys: pytest.CaptureFixture
) -> None:
    tiles, _ = servers
    args = [str(slide), "--url", tiles.url, "--out", str(tmp_path), "--slide-model", "h0-mini"]
    assert embed_main(args) == 2
    assert "not a slide head" in capsys.readouterr().err
    assert not (tmp_path / "W1.h5").exists()
