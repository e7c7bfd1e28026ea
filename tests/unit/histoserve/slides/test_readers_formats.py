"""CZI (pylibCZIrw) and DICOM WSI (OpenSlide 4) slides read the same pixels as a TIFF of them.

Slides are generated from one :class:`~harness.slides.SlideSpec` as a lossless
TIFF, a CZI (zstd, and JPEG-XR re-encoded) and a DICOM WSI folder
(:mod:`harness.slide_formats`); the mpp of each comes from its own metadata.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness import slides
from harness.slide_formats import write_czi, write_czi_jpegxr, write_dicom
from histoserve.errors import SlideError
from histoserve.slides.readers import SlideReader, resolve_mpp

SPEC = slides.SlideSpec(
    mpp=(0.5, 0.5), vendor="generic", compression="deflate", **slides.standard_layout(224)
)
REGION = ((200, 300), (700, 500))


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("formats")
    raw = write_czi(root / "raw.czi", SPEC, "uncompressed:")
    return {
        "tiff": slides.write_slide(root / "s.tiff", SPEC).path,
        "czi": write_czi(root / "s.czi", SPEC),
        "jpegxr": write_czi_jpegxr(raw, root / "jpegxr.czi"),
        "dicom": write_dicom(root / "dicom", SPEC),
    }


def _read(path: Path, level: int = 0) -> np.ndarray:
    with SlideReader.open(path) as reader:
        return reader.read_region(REGION[0], level, REGION[1])


@pytest.mark.parametrize("name", ["czi", "dicom"])
def test_lossless_formats_read_exactly_the_tiff_pixels(formats: dict, name: str) -> None:
    np.testing.assert_array_equal(_read(formats[name]), _read(formats["tiff"]))


def test_jpegxr_czi_reads_close_to_the_tiff_pixels(formats: dict) -> None:
    diff = np.abs(_read(formats["jpegxr"]).astype(int) - _read(formats["tiff"]).astype(int))
    assert diff.mean() < 2.0  # lossy, but the same image in the same channel order
    for channel in range(3):
        assert diff[..., channel].mean() < 2.0


@pytest.mark.parametrize(
    ("name", "backend", "source"),
    [
        ("czi", "czi", "czi.mpp"),
        ("jpegxr", "czi", "czi.mpp"),
        ("dicom", "openslide", "openslide.mpp"),
    ],
)
def test_geometry_and_mpp_from_their_own_metadata(
    formats: dict, name: str, backend: str, source: str
) -> None:
    with SlideReader.open(formats[name]) as reader:
        assert reader.backend == backend
        assert reader.dimensions == (SPEC.width, SPEC.height)
        mpp = resolve_mpp(reader, None, None, 0.05)
    assert mpp.mpp == pytest.approx(0.5) and mpp.source == source


def test_dicom_levels_match_the_tiff_levels(formats: dict) -> None:
    with SlideReader.open(formats["dicom"]) as dicom, SlideReader.open(formats["tiff"]) as tiff:
        assert dicom.level_dimensions == tiff.level_dimensions
    np.testing.assert_array_equal(_read(formats["dicom"], 2), _read(formats["tiff"], 2))


def test_a_dcm_file_of_the_series_opens_the_slide(formats: dict) -> None:
    with SlideReader.open(formats["dicom"] / "level1.dcm") as reader:
        assert reader.dimensions == (SPEC.width, SPEC.height)


def test_large_czi_has_coarse_zoomed_levels(tmp_path: Path) -> None:
    spec = slides.SlideSpec(width=8192, height=4096, boxes=((1024, 1024, 2048, 2048),),
                            vendor="generic", compression="deflate", mpp=(0.25, 0.25))  # fmt: skip
    with SlideReader.open(write_czi(tmp_path / "big.czi", spec)) as reader:
        assert reader.level_downsamples == (1.0, 8.0)
        assert reader.level_dimensions == ((8192, 4096), (1024, 512))
        region = reader.read_region((1024, 1024), 1, (64, 64))
    assert region.shape == (64, 64, 3) and region.std() > 5  # tissue texture, not background


def test_bad_inputs_fail_with_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SlideError, match="DICOM"):
        SlideReader.open(tmp_path / "empty")
    (tmp_path / "bad.czi").write_bytes(b"not a czi" * 100)
    with pytest.raises(SlideError, match="CZI"):
        SlideReader.open(tmp_path / "bad.czi")
