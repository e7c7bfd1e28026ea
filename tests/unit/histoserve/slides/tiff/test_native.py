"""The native JPEG-TIFF reader: OpenSlide's numbers and pixels, its fallbacks, its bounds.

Real slides written by :mod:`harness.slides` and :mod:`harness.jpeg_slides`
(Aperio-style and generic, Photometric RGB and YCbCr, shared tables or not,
edge tiles), compared with OpenSlide's ``read_region`` on the same file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness import jpeg_slides, slides
from histoserve.errors import SlideError
from histoserve.slides.grid import plan_tiles, read_tiles
from histoserve.slides.readers import SlideReader, resolve_mpp
from histoserve.slides.tiff.native import NativeTiff, TileCache

APERIO = slides.SlideSpec(mpp=(0.25, 0.25), vendor="aperio", **slides.standard_layout(448))
GENERIC = slides.SlideSpec(
    mpp=(0.5, 0.5), vendor="generic", compression="jpeg", **slides.standard_layout(224)
)
# 3584 x 2688 in 240 px tiles: partial tiles at the right and bottom of every level.
EDGES = slides.SlideSpec(mpp=(0.25, 0.25), vendor="aperio", tile=240, **slides.standard_layout(448))


def _write(kind: str, folder: Path) -> Path:
    path = folder / f"{kind}.svs"
    if kind == "tifffile-ycbcr-jfif":  # Photometric YCbCr, JFIF, tables in every tile
        return slides.write_slide(folder / f"{kind}.tif", GENERIC).path
    if kind == "aperio-rgb-adobe-shared":  # Photometric RGB, Adobe (YCbCr), JPEGTables
        return jpeg_slides.jpeg_tiff(path, APERIO, marker="adobe").path
    if kind == "aperio-rgb-bare-shared":  # Photometric RGB, no marker, JPEGTables
        return jpeg_slides.jpeg_tiff(path, APERIO).path
    if kind == "generic-ycbcr-shared":  # Photometric YCbCr, no marker, JPEGTables
        return jpeg_slides.jpeg_tiff(folder / f"{kind}.tif", GENERIC, photometric="ycbcr").path
    if kind == "aperio-edge-tiles":
        return jpeg_slides.jpeg_tiff(path, EDGES, marker="adobe", shared_tables=False).path
    raise ValueError(kind)


KINDS = (
    "tifffile-ycbcr-jfif",
    "aperio-rgb-adobe-shared",
    "aperio-rgb-bare-shared",
    "generic-ycbcr-shared",
    "aperio-edge-tiles",
)


@pytest.fixture(scope="module", params=KINDS)
def slide(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(request.param, tmp_path_factory.mktemp("native"))


def test_auto_reads_natively_with_openslides_numbers(slide: Path) -> None:
    with SlideReader.open(slide, "auto") as native, SlideReader.open(slide) as reference:
        assert (native.backend, reference.backend) == ("native", "openslide")
        assert native.level_dimensions == reference.level_dimensions
        assert native.level_downsamples == reference.level_downsamples
        assert native.properties == reference.properties
        assert resolve_mpp(native, None, None, 0.05) == resolve_mpp(reference, None, None, 0.05)


def test_every_level_is_openslides_pixels(slide: Path) -> None:
    with SlideReader.open(slide, "native") as native, SlideReader.open(slide) as reference:
        for level, (w, h) in enumerate(native.level_dimensions):
            d = int(native.level_downsamples[level])
            regions = [
                ((0, 0), (w, h)),  # the whole level, edge tiles cropped
                ((100 * d, 37 * d), (300, 200)),  # across tile borders
                (((w - 50) * d, (h - 30) * d), (120, 90)),  # past the edge: white
                ((3, 5), (64, 48)),  # between level pixels (levels > 0): OpenSlide's resampling
            ]
            for xy, size in regions:
                ours, theirs = (
                    native.read_region(xy, level, size),
                    reference.read_region(xy, level, size),
                )
                np.testing.assert_array_equal(ours, theirs, err_msg=f"{level} {xy} {size}")


def test_model_tiles_are_openslides_and_each_slide_tile_is_decoded_once(tmp_path: Path) -> None:
    path = _write("aperio-rgb-bare-shared", tmp_path)
    cache = TileCache()
    with SlideReader.open(path, "native", cache) as native, SlideReader.open(path) as reference:
        mpp = resolve_mpp(native, None, None, 0.05)
        plan = plan_tiles(native, mpp, 0.5, 224, 0.05)  # level 1 matches: read as is
        assert plan.read_level == 1 and not plan.resized
        ours = read_tiles(native, plan, plan.coords)
        np.testing.assert_array_equal(ours, read_tiles(reference, plan, plan.coords))
    w, h = native.level_dimensions[1]
    used_w, used_h = (w // 224) * 224, (h // 224) * 224  # the grid's extent at level 1
    assert cache.decoded == -(-used_w // 256) * -(-used_h // 256)


def test_the_tile_cache_stays_within_its_bytes() -> None:
    cache = TileCache(max_bytes=3 * 256 * 256 * 3)
    for i in range(10):
        cache.put((0, i, 0, 1), np.zeros((256, 256, 3), np.uint8))
        assert cache.bytes <= cache.max_bytes
    assert cache.get((0, 9, 0, 1)) is not None and cache.get((0, 0, 0, 1)) is None


@pytest.mark.parametrize("kind", ["deflate", "rgb-coded"])
def test_other_slides_take_openslide_and_native_says_why(kind: str, tmp_path: Path) -> None:
    if kind == "deflate":
        path, why = slides.generic_tiff(tmp_path / "d.tif").path, "TIFF scheme 8"
    else:  # OpenSlide converts RGB-coded JPEG as YCbCr: never read natively
        path = jpeg_slides.jpeg_tiff(tmp_path / "r.svs", APERIO, coding="rgb", marker="adobe").path
        why = "RGB-coded"
    with SlideReader.open(path, "auto") as reader:
        assert reader.backend == "openslide"
    with pytest.raises(SlideError, match=why) as caught:
        SlideReader.open(path, "native")
    assert str(path) in str(caught.value) and "--reader native" in str(caught.value)


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda data: b"\0" * len(data), "start-of-image"),
        (_truncate, "corrupt JPEG data|truncated|ends before"),
        (jpeg_slides.huge_frame, "65500x65500 px, the TIFF's tiles are 256x256"),
    ],
    ids=["zeros", "truncated", "huge-declared-size"],
)
def test_a_bad_tile_fails_that_tile_naming_the_file(change, why: str, tmp_path: Path) -> None:
    good = _write("aperio-rgb-bare-shared", tmp_path)
    bad = jpeg_slides.patch_tile(good, tmp_path / "bad.svs", 30, change)  # column 2, row 2
    with SlideReader.open(bad, "native") as reader:
        with pytest.raises(SlideError, match=why) as caught:
            reader.read_region((600, 600), 0, (64, 64))
        assert str(bad) in str(caught.value) and "level 0 tile (2, 2)" in str(caught.value)
        assert reader.read_region((0, 0), 0, (64, 64)).shape == (64, 64, 3)  # the rest reads


def test_a_declared_tile_size_beyond_the_limit_is_refused(tmp_path: Path) -> None:
    good = _write("aperio-rgb-bare-shared", tmp_path)
    bad = jpeg_slides.set_tile_size(good, tmp_path / "big.svs", 8192)
    with pytest.raises(SlideError, match="8192x8192"):
        SlideReader.open(bad, "native")


def test_compressed_tiles_and_tables_come_out_undecoded(tmp_path: Path) -> None:
    path = _write("aperio-rgb-bare-shared", tmp_path)
    handle = NativeTiff.open(path)
    try:
        tables, data = handle.jpeg_tables(0), handle.tile_bytes(0, 2, 1)
        assert tables is not None and tables.startswith(b"\xff\xd8") and b"\xff\xdb" in tables
        assert data.startswith(b"\xff\xd8") and b"\xff\xdb" not in data  # abbreviated
        assert handle.tile_size(0) == (256, 256)
        with pytest.raises(SlideError, match="no tile"):
            handle.tile_bytes(0, 99, 0)
    finally:
        handle.close()
