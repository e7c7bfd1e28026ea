"""Opening slides and finding their level-0 mpp, on real generated files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openslide
import pytest

from harness.slides import GeneratedSlide, render_region
from histoserve.errors import SlideError
from histoserve.slides.readers import MppInfo, SlideReader, mpp_from_properties, resolve_mpp

TOL = 0.05


def _props_without(reader: SlideReader, *prefixes: str) -> dict[str, str]:
    return {k: v for k, v in reader.properties.items() if not k.startswith(prefixes)}


def test_svs_opens_with_openslide_and_reads_its_pixels(svs_slide: GeneratedSlide) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        assert reader.backend == "openslide"
        assert reader.dimensions == (3584, 2688)
        assert reader.level_dimensions == svs_slide.level_dimensions
        assert reader.level_downsamples == (1.0, 2.0, 8.0)
        region = reader.read_region((448, 448), 0, (240, 200))
    assert region.dtype == np.uint8 and region.shape == (200, 240, 3)
    truth = render_region(svs_slide.spec, 448, 448, 240, 200).astype(int)
    assert np.abs(region.astype(int) - truth).mean() < 8  # JPEG at quality 90


def test_outside_the_slide_is_white(tiff_slide: GeneratedSlide) -> None:
    with SlideReader.open(tiff_slide.path) as reader:
        region = reader.read_region((-64, -64), 0, (64, 64))
    assert (region == 255).all()


def test_mpp_from_each_slide_kind(svs_slide: GeneratedSlide, tiff_slide: GeneratedSlide) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        assert reader.properties["aperio.MPP"] == "0.25"
        assert resolve_mpp(reader, None, None, TOL) == MppInfo(0.25, "openslide.mpp")
        # Without OpenSlide's normalised keys the Aperio description still answers.
        props = _props_without(reader, "openslide.")
        assert mpp_from_properties(props, TOL, "x") == MppInfo(0.25, "aperio.MPP")
    with SlideReader.open(tiff_slide.path) as reader:
        assert resolve_mpp(reader, None, None, TOL) == MppInfo(0.5, "openslide.mpp")
        props = _props_without(reader, "openslide.")
        assert props["tiff.ResolutionUnit"] == "centimeter"
        assert mpp_from_properties(props, TOL, "x") == MppInfo(0.5, "tiff.resolution")


def test_override_then_manifest_come_before_metadata(svs_slide: GeneratedSlide) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        assert resolve_mpp(reader, 0.3, 0.4, TOL) == MppInfo(0.3, "override")
        assert resolve_mpp(reader, None, 0.4, TOL) == MppInfo(0.4, "manifest")


def test_tiff_resolution_in_inches() -> None:
    props = {
        "tiff.ResolutionUnit": "inch",
        "tiff.XResolution": "50800",
        "tiff.YResolution": "50800",
    }
    assert mpp_from_properties(props, TOL, "x") == MppInfo(0.5, "tiff.resolution")


def test_tiffslide_property_names_count_as_metadata() -> None:
    props = {"tiffslide.mpp-x": "0.25", "tiffslide.mpp-y": "0.25"}
    assert mpp_from_properties(props, TOL, "x") == MppInfo(0.25, "openslide.mpp")


def test_no_mpp_fails_saying_how_to_give_it(nompp_slide: GeneratedSlide) -> None:
    with SlideReader.open(nompp_slide.path) as reader:
        with pytest.raises(SlideError) as info:
            resolve_mpp(reader, None, None, TOL)
        # The same slide works once the user gives the mpp.
        assert resolve_mpp(reader, 0.5, None, TOL).source == "override"
    message = str(info.value)
    assert "nompp.tiff" in message and "no microns-per-pixel" in message
    assert "--mpp-override" in message and "manifest's mpp column" in message


def test_non_square_pixels_fail(nonsquare_slide: GeneratedSlide) -> None:
    with SlideReader.open(nonsquare_slide.path) as reader:
        with pytest.raises(SlideError, match=r"non-square pixels, x=0.5 y=0.6.*--mpp-override"):
            resolve_mpp(reader, None, None, TOL)
        # Within a wider tolerance the same slide is accepted.
        assert resolve_mpp(reader, None, None, 0.2).mpp == pytest.approx(0.5)


def test_screen_resolution_defaults_are_not_a_scale() -> None:
    props = {"tiff.ResolutionUnit": "inch", "tiff.XResolution": "72", "tiff.YResolution": "72"}
    with pytest.raises(SlideError, match=r"352.778 x 352.778 um/px, outside.*--mpp-override"):
        mpp_from_properties(props, TOL, "x")


def test_only_one_axis_fails() -> None:
    with pytest.raises(SlideError, match="only one of x and y"):
        mpp_from_properties({"openslide.mpp-x": "0.25"}, TOL, "x")


def test_truncated_slide_fails_at_open(truncated_slide: Path) -> None:
    with pytest.raises(SlideError, match=r"truncated.*copy the slide again"):
        SlideReader.open(truncated_slide)


@pytest.mark.parametrize("keep", [0.2, 0.7, 0.95])
def test_truncated_anywhere_fails(svs_slide: GeneratedSlide, tmp_path: Path, keep: float) -> None:
    from harness.slides import truncated_copy

    with pytest.raises(SlideError, match="truncated"):
        SlideReader.open(truncated_copy(svs_slide.path, tmp_path / "cut.svs", keep))


def test_not_a_slide_and_missing_file(tmp_path: Path) -> None:
    junk = tmp_path / "notes.svs"
    junk.write_text("not a slide")
    with pytest.raises(SlideError, match=r"cannot open slide .*notes.svs.*OpenSlide.*tiffslide"):
        SlideReader.open(junk)
    with pytest.raises(SlideError, match="slide file not found"):
        SlideReader.open(tmp_path / "absent.svs")


def test_tiffslide_fallback_reads_what_openslide_refuses(
    stripped_tiff: tuple[Path, np.ndarray],
) -> None:
    path, pixels = stripped_tiff
    with pytest.raises(openslide.OpenSlideError):
        openslide.OpenSlide(str(path))
    with SlideReader.open(path) as reader:
        assert reader.backend == "tiffslide"
        assert reader.dimensions == (800, 600)
        assert resolve_mpp(reader, None, None, TOL) == MppInfo(0.5, "openslide.mpp")
        assert np.array_equal(reader.read_region((100, 50), 0, (64, 32)), pixels[50:82, 100:164])


def test_bounds_default_to_the_whole_slide_and_follow_bounds_properties(
    svs_slide: GeneratedSlide,
) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        assert reader.bounds() == (0, 0, 3584, 2688)
        handle = openslide.OpenSlide(str(svs_slide.path))
        # No writable format carries bounds (MRXS/SCN), so they are injected beside the real file.
        props = {
            **reader.properties,
            "openslide.bounds-x": "448",
            "openslide.bounds-y": "0",
            "openslide.bounds-width": "1000",
            "openslide.bounds-height": "900",
        }
        bounded = SlideReader(handle, svs_slide.path, "openslide", props)
        assert bounded.bounds() == (448, 0, 1000, 900)
        bounded.close()


def test_reopen_gives_a_working_handle(svs_slide: GeneratedSlide) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        before = reader.read_region((900, 900), 1, (50, 50))
        reader.reopen()
        assert np.array_equal(reader.read_region((900, 900), 1, (50, 50)), before)


def test_bad_mpp_values_are_refused() -> None:
    with pytest.raises(SlideError, match="positive"):
        MppInfo(0.0, "override")


def test_a_corrupt_tile_region_is_a_slide_error_and_reopen_recovers(
    tiff_slide: GeneratedSlide, tmp_path: Path
) -> None:
    from harness.slides import corrupt_tiles_copy

    # TIFF tile 30 of a 14-wide grid of 256 px tiles: x, y in [512, 768).
    path = corrupt_tiles_copy(tiff_slide.path, tmp_path / "corrupt.tiff", [30])
    with SlideReader.open(path) as reader:
        good = reader.read_region((0, 0), 0, (64, 64))
        with pytest.raises(SlideError, match=r"cannot read region x=600 y=600 level=0"):
            reader.read_region((600, 600), 0, (10, 10))
        reader.reopen()  # OpenSlide's error is sticky on the old handle
        assert np.array_equal(reader.read_region((0, 0), 0, (64, 64)), good)


def test_bounds_are_clipped_to_the_slide_and_bad_bounds_count_as_none(
    svs_slide: GeneratedSlide,
) -> None:
    def bounds(**given: str) -> tuple[int, int, int, int]:
        props = {f"openslide.bounds-{k}": v for k, v in given.items()}
        with SlideReader(
            openslide.OpenSlide(str(svs_slide.path)), svs_slide.path, "openslide", props
        ) as reader:
            return reader.bounds()

    assert bounds(x="-100", y="2000", width="1e12", height="900") == (0, 2000, 3584, 688)
    assert bounds(x="abc", y="0", width="10", height="10") == (0, 0, 3584, 2688)
    assert bounds(x="0", y="0", width="nan", height="10") == (0, 0, 3584, 2688)
    assert bounds(x="10", y="20") == (0, 0, 3584, 2688)  # partial: none
