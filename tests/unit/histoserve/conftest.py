"""Real slides for the embed unit tests, generated once per session by :mod:`harness.slides`.

Every fixture is a real tiled pyramidal TIFF that OpenSlide opens (checked
when it is written), with tissue boxes of known position; tests must not
modify them (copy first).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.slides import (
    GeneratedSlide,
    SlideSpec,
    aperio_svs,
    generic_tiff,
    truncated_copy,
    write_slide,
)


@pytest.fixture(scope="session")
def slide_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's folder of generated slides."""
    return tmp_path_factory.mktemp("slides")


@pytest.fixture(scope="session")
def svs_slide(slide_dir: Path) -> GeneratedSlide:
    """Aperio-style SVS, JPEG, MPP 0.25 in the description, levels 1/2/8, boxes on a 448 grid."""
    return aperio_svs(slide_dir / "aperio.svs")


@pytest.fixture(scope="session")
def tiff_slide(slide_dir: Path) -> GeneratedSlide:
    """Generic tiled TIFF, deflate, 0.5 um/px in resolution tags (cm), boxes on a 224 grid."""
    return generic_tiff(slide_dir / "generic.tiff")


@pytest.fixture(scope="session")
def nompp_slide(slide_dir: Path) -> GeneratedSlide:
    """Generic tiled TIFF without any mpp (resolution unit NONE)."""
    return generic_tiff(slide_dir / "nompp.tiff", mpp=None)


@pytest.fixture(scope="session")
def nonsquare_slide(slide_dir: Path) -> GeneratedSlide:
    """Generic tiled TIFF with 0.5 x 0.6 um pixels."""
    return generic_tiff(slide_dir / "nonsquare.tiff", mpp=(0.5, 0.6))


@pytest.fixture(scope="session")
def blank_slide(slide_dir: Path) -> GeneratedSlide:
    """White glass only: JPEG, 0.25 um/px, no tissue at all."""
    spec = SlideSpec(width=3584, height=2688, boxes=())
    return write_slide(slide_dir / "blank.svs", spec)


@pytest.fixture(scope="session")
def truncated_slide(svs_slide: GeneratedSlide, slide_dir: Path) -> Path:
    """The SVS cut after half its bytes (a broken copy)."""
    return truncated_copy(svs_slide.path, slide_dir / "truncated.svs", 0.5)


@pytest.fixture(scope="session")
def stripped_tiff(slide_dir: Path) -> tuple[Path, np.ndarray]:
    """A striped (not tiled) RGB TIFF: OpenSlide refuses it, tiffslide reads it; and its pixels."""
    import tifffile

    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, (600, 800, 3), dtype=np.uint8)
    path = slide_dir / "stripped.tif"
    tifffile.imwrite(
        path, pixels, photometric="rgb", resolution=(20000.0, 20000.0), resolutionunit="CENTIMETER"
    )
    return path, pixels
