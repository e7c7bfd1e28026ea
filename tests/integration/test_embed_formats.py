"""``histoserve embed`` on CZI and DICOM WSI slides: the same features as from a TIFF.

Real parts: one :class:`~harness.slides.SlideSpec` written as a lossless TIFF,
a CZI (zstd), a JPEG-XR CZI and a DICOM WSI folder (:mod:`harness.slide_formats`);
the demo ``.pt2`` served on loopback; the CLI in its own interpreter. The mpp
of every slide comes from its own metadata (no ``--mpp-override``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness import slides
from harness.embed import by_status, read_output, run_embed, status_rows
from harness.server import Server
from harness.slide_formats import write_czi, write_czi_jpegxr, write_dicom

pytestmark = pytest.mark.integration
RTOL, ATOL = 1e-4, 1e-5
SPEC = slides.SlideSpec(
    mpp=(0.5, 0.5), vendor="generic", compression="deflate", **slides.standard_layout(224)
)


@pytest.fixture(scope="module")
def run(embedding_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("format-slides")
    raw = write_czi(root / "raw.czi", SPEC, "uncompressed:")
    paths = [
        slides.write_slide(root / "tiff.tiff", SPEC).path,
        write_czi(root / "zeiss.czi", SPEC),
        write_czi_jpegxr(raw, root / "zeiss-jpegxr.czi"),
        write_dicom(root / "dicom", SPEC),
    ]
    out = tmp_path_factory.mktemp("format-out")
    result = run_embed(*paths, "--url", embedding_server.base, "--out", out, "--batch-size", "8")
    assert result.returncode == 0, result.stderr
    return out


def test_every_format_is_done_with_its_own_mpp(run: Path) -> None:
    expected = ["dicom", "tiff", "zeiss", "zeiss-jpegxr"]
    assert sorted(by_status(status_rows(run))["done"]) == expected
    sources = {name: read_output(run / f"{name}.h5")["attrs"]["mpp_source"] for name in expected}
    assert sources == {
        "dicom": "openslide.mpp",
        "tiff": "openslide.mpp",  # OpenSlide turns the resolution tags into mpp
        "zeiss": "czi.mpp",
        "zeiss-jpegxr": "czi.mpp",
    }


@pytest.mark.parametrize("name", ["zeiss", "dicom"])
def test_lossless_formats_embed_to_the_tiffs_numbers(run: Path, name: str) -> None:
    tiff, other = read_output(run / "tiff.h5"), read_output(run / f"{name}.h5")
    np.testing.assert_array_equal(other["coords"], tiff["coords"])
    assert len(tiff["coords"]) == 10  # the two tissue boxes' 6 + 4 tiles of 224 px
    np.testing.assert_allclose(other["features"], tiff["features"], rtol=RTOL, atol=ATOL)


def test_jpegxr_czi_embeds_close_to_the_tiff(run: Path) -> None:
    tiff, jxr = read_output(run / "tiff.h5"), read_output(run / "zeiss-jpegxr.h5")
    np.testing.assert_array_equal(jxr["coords"], tiff["coords"])
    a, b = tiff["features"], jxr["features"]
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() > 0.99, cosine
