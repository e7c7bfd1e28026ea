"""``--overlap PX``: tiles sharing PX pixels with their neighbours, recorded as TRIDENT records it."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from harness import slides
from harness.bad_server import BadServer
from histoserve.embedding.config import EmbedConfig
from histoserve.embedding.pipeline import embed
from histoserve.errors import UsageError
from histoserve.heads.aggregate import AggregateConfig, aggregate
from histoserve.slides.grid import grid_coords, plan_tiles, step_level0
from histoserve.slides.readers import MppInfo, SlideReader
from tests.unit.histoserve.heads.features import TILE_CONFIG
from tests.unit.histoserve.heads.features import D as DIM


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return slides.generic_tiff(tmp_path_factory.mktemp("wsi") / "W1.tiff").path


def test_the_grid_steps_by_the_footprint_less_the_overlap() -> None:
    assert step_level0(448, 224, 0) == 448 and step_level0(448, 224, 112) == 224
    assert (
        grid_coords((0, 0, 1000, 500), 448).tolist()
        == grid_coords((0, 0, 1000, 500), 448, 448).tolist()
    )
    xs = sorted({x for x, _ in grid_coords((10, 0, 1000, 448), 448, 224).tolist()})
    assert xs == [10, 234, 458]  # wholly inside: 458 + 448 <= 1010


def test_plan_tiles_with_overlap(slide: Path) -> None:
    with SlideReader.open(slide) as reader:
        plain = plan_tiles(reader, MppInfo(0.5, "test"), 0.5, 224, 0.05)
        half = plan_tiles(reader, MppInfo(0.5, "test"), 0.5, 224, 0.05, overlap=112)
        with pytest.raises(ValueError, match="overlap"):
            plan_tiles(reader, MppInfo(0.5, "test"), 0.5, 224, 0.05, overlap=224)
    assert half.step_level0 == 112 and half.patch_size_level0 == plain.patch_size_level0 == 224
    assert len(half.coords) > 3 * len(plain.coords)


def _run(out: Path, slide: Path, url: str, overlap: int) -> object:
    config = EmbedConfig(
        urls=(url,), out_dir=out, slides=(slide,), model="h0-mini", layout="trident",
        tissue="none", progress="none", overlap=overlap, qc=False,
    )  # fmt: skip
    return embed(config)


def test_trident_records_the_overlap_and_resume_is_keyed_by_it(tmp_path: Path, slide: Path) -> None:
    with BadServer(config=TILE_CONFIG, source="pixels", dim=DIM) as tiles:
        assert _run(tmp_path, slide, tiles.url, 112).done == ["W1"]
        assert _run(tmp_path, slide, tiles.url, 112).skipped == ["W1"]
        assert _run(tmp_path, slide, tiles.url, 0).done == ["W1"]  # another folder, another hash
        assert (tmp_path / "20x_224px_112px_overlap" / ".histoserve-run.json").is_file()
        assert (tmp_path / "20x_224px_0px_overlap" / ".histoserve-run.json").is_file()
    features = tmp_path / "20x_224px_112px_overlap" / "features_h0-mini" / "W1.h5"
    with h5py.File(features) as f:
        assert f["coords"].attrs["overlap"] == 112
        xs = np.unique(f["coords"][:, 0])
        assert set(np.diff(xs).tolist()) == {112}
    assert (tmp_path / "20x_224px_0px_overlap" / "features_h0-mini" / "W1.h5").is_file()
    with h5py.File(tmp_path / "20x_224px_112px_overlap" / "patches" / "W1_patches.h5") as f:
        assert f["coords"].attrs["overlap"] == 112


def test_an_overlap_as_large_as_a_tile_is_a_usage_error(tmp_path: Path, slide: Path) -> None:
    tiles = BadServer(config=TILE_CONFIG, source="pixels", dim=DIM)
    with tiles, pytest.raises(UsageError, match="--overlap 224"):
        _run(tmp_path, slide, tiles.url, 224)
    with pytest.raises(UsageError, match="--overlap"):
        EmbedConfig(urls=("http://x:1",), out_dir=tmp_path, slides=(slide,), overlap=-1)


def test_slide_model_takes_the_run_s_own_trident_folder(tmp_path: Path, slide: Path) -> None:
    from harness.slide_server import SlideServer

    with BadServer(config=TILE_CONFIG, source="pixels", dim=DIM) as tiles:
        _run(tmp_path, slide, tiles.url, 0)  # a 0px_overlap folder beside the next run's
        with SlideServer("abmil-demo", DIM) as head:
            config = EmbedConfig(
                urls=(tiles.url,), out_dir=tmp_path, slides=(slide,), model="h0-mini",
                layout="trident", tissue="none", progress="none", overlap=112,
                slide_model="abmil-demo", slide_urls=(head.url,),
            )  # fmt: skip
            summary = embed(config)
    assert summary.done == ["W1"] and not summary.failed
    assert (tmp_path / "20x_224px_112px_overlap" / "slide_features_abmil-demo" / "W1.h5").is_file()
    assert not (tmp_path / "20x_224px_0px_overlap" / "slide_features_abmil-demo").exists()


def test_the_heatmap_of_overlapping_tiles(tmp_path: Path, slide: Path) -> None:
    from harness.slide_server import SlideServer

    with BadServer(config=TILE_CONFIG, source="pixels", dim=DIM) as tiles:
        config = EmbedConfig(
            urls=(tiles.url,), out_dir=tmp_path, slides=(slide,), model="h0-mini",
            tissue="none", progress="none", overlap=112,
        )  # fmt: skip
        assert embed(config).done == ["W1"]
    with SlideServer("abmil-demo", DIM) as head:
        assert aggregate(AggregateConfig(tmp_path, (head.url,), "abmil-demo")).done == ["W1"]
    assert (tmp_path / "qc" / "W1.abmil-demo.heatmap.jpg").is_file()
