"""Output layouts: file names, slide ids and attributes as TRIDENT's and CLAM's loaders read them.

Each "consumer" check below follows the consumer's own loading code (read
from their repositories, not imported: neither is installed here):

- TRIDENT ``trident/IO.py::read_coords`` (``dict(f['coords'].attrs)``, ``f['coords'][:]``)
  and ``WSI.extract_features``/``extract_slide_features`` (``f['features'][:]``,
  needs ``patch_size``, ``level0_magnification``, ``target_magnification``);
- CLAM ``dataset_modules/dataset_generic.py`` (``torch.load(pt_files/<id>.pt)``;
  ``h5_files/<id>.h5``: ``features``, ``coords``) and ``dataset_h5.py::Whole_Slide_Bag_FP``
  (``read_region(coord, attrs['patch_level'], (attrs['patch_size'],) * 2)``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from harness.slides import GeneratedSlide
from predictor.client.embed.errors import UsageError
from predictor.client.embed.grid import plan_tiles
from predictor.client.embed.layouts import (
    Layout,
    slide_id_from_path,
    trident_encoder,
    trident_magnification,
)
from predictor.client.embed.output import SlideResult, config_hash, plan_attrs
from predictor.client.embed.slides import MppInfo, SlideReader

REPO = Path(__file__).resolve().parents[3]
HASH = config_hash({"model": "h-optimus-0", "layout": "x"})
D = 8


@pytest.fixture(scope="module")
def slide_attrs(svs_slide: GeneratedSlide) -> dict:
    """A real plan that resizes: 1 um/px tiles from a 0.25 um/px slide with levels 1/2/8.

    No level is at 1 um/px, so 448 px are read at level 1 (2x) and resized to 224.
    """
    with SlideReader.open(svs_slide.path) as reader:
        plan = plan_tiles(reader, MppInfo(0.25, "openslide.mpp"), 1.0, 224, 0.05)
        return {**plan_attrs(reader, plan), "slide_id": "S1", "config_hash": HASH}


def _result(attrs: dict, n: int = 5) -> SlideResult:
    rng = np.random.default_rng(1)
    coords = np.stack([np.arange(n) * 448, np.full(n, 896)], axis=1).astype(np.int64)
    return SlideResult(
        features=rng.standard_normal((n, D)).astype(np.float32),
        predictions=None,
        coords=coords,
        tissue_fraction=np.linspace(0.3, 1.0, n).astype(np.float32),
        attrs=attrs,
    )


def _layout(name: str, out: Path) -> Layout:
    return Layout(name, out, 1.0, 224, "h-optimus-0", D)


def test_slide_ids_follow_each_tool() -> None:
    assert slide_id_from_path("a/x.ome.tiff", "trident") == "x"
    assert slide_id_from_path("a/X.OME.TIF", "trident") == "X"
    assert slide_id_from_path("a/x.ome.tiff", "clam") == "x.ome"
    assert slide_id_from_path("a/x.ome.tiff", "flat") == "x.ome"
    assert slide_id_from_path("a/TCGA-01.svs", "trident") == "TCGA-01"
    assert slide_id_from_path("a/dicom_folder", "clam") == "dicom_folder"


def test_trident_encoder_names_and_magnifications() -> None:
    assert trident_encoder("h-optimus-0") == "hoptimus0"
    assert trident_encoder("H-Optimus-1") == "hoptimus1"
    assert trident_encoder("h0_mini") == "h0-mini"
    assert trident_encoder("my-model") == "my-model"
    assert trident_magnification(0.2431) == 40  # TRIDENT's bins, not round(10 / mpp) = 41
    assert trident_magnification(0.5) == 20


def test_trident_files_read_as_trident_reads_them(tmp_path: Path, slide_attrs: dict) -> None:
    layout = _layout("trident", tmp_path)
    result = _result(slide_attrs)
    done = layout.write("S1", result)
    job = tmp_path / "10x_224px_0px_overlap"
    assert done == job / "features_hoptimus0" / "S1.h5"
    with h5py.File(job / "patches" / "S1_patches.h5", "r") as f:
        attrs, coords = dict(f["coords"].attrs), f["coords"][:]
    assert coords.dtype == np.int64 and coords.shape == (5, 2)
    np.testing.assert_array_equal(coords, result.coords)
    assert attrs["patch_size"] == 224 and attrs["patch_size_level0"] == 896
    assert attrs["level0_magnification"] == 40 and attrs["target_magnification"] == 10
    assert attrs["overlap"] == 0 and attrs["name"] == "S1" and attrs["savetodir"] == str(job)
    assert (attrs["level0_width"], attrs["level0_height"]) == (
        slide_attrs["level0_width"],
        slide_attrs["level0_height"],
    )
    with h5py.File(done, "r") as f:
        features = f["features"][:]
        assert dict(f["features"].attrs)["encoder"] == "hoptimus0"
        assert dict(f["coords"].attrs)["patch_size"] == 224
    assert features.dtype == np.float32 and features.shape == (5, D)
    np.testing.assert_array_equal(features, result.features)


def test_clam_files_read_as_clam_reads_them(tmp_path: Path, slide_attrs: dict) -> None:
    import torch

    layout = _layout("clam", tmp_path)
    result = _result(slide_attrs)
    done = layout.write("S1", result)
    assert done == tmp_path / "h5_files" / "S1.h5"
    loaded = torch.load(tmp_path / "pt_files" / "S1.pt")
    assert isinstance(loaded, torch.Tensor) and loaded.dtype == torch.float32
    np.testing.assert_array_equal(loaded.numpy(), result.features)
    with h5py.File(done, "r") as f:
        features, coords = f["features"][:], f["coords"][:]
        patch_level = f["coords"].attrs["patch_level"]
        patch_size = f["coords"].attrs["patch_size"]
        downsample = f["coords"].attrs["downsample"]
        custom = f["coords"].attrs["custom_downsample"]
    np.testing.assert_array_equal(features, result.features)
    np.testing.assert_array_equal(coords, result.coords)
    # The area actually read (448 px at level 1), not the model's 224 px tile.
    assert (patch_level, patch_size, custom) == (1, 448, 2)
    np.testing.assert_array_equal(downsample, [2.0, 2.0])


@pytest.mark.parametrize("name", ["flat", "trident", "clam"])
def test_resume_needs_every_file_complete_with_the_hash(
    tmp_path: Path, slide_attrs: dict, name: str
) -> None:
    layout = _layout(name, tmp_path)
    assert not layout.is_done("S1", HASH)
    layout.write("S1", _result(slide_attrs))
    assert layout.is_done("S1", HASH)
    assert not layout.is_done("S1", config_hash({"other": 1}))
    assert not list(tmp_path.rglob("*.tmp"))
    first = layout.files("S1")[0]
    first.unlink()
    assert not layout.is_done("S1", HASH)


@pytest.mark.parametrize("name", ["flat", "trident", "clam"])
def test_an_empty_slide_has_zero_by_d_features(
    tmp_path: Path, slide_attrs: dict, name: str
) -> None:
    empty = SlideResult(
        np.zeros((0, 0), np.float32),
        None,
        np.zeros((0, 2), np.int64),
        np.zeros(0, np.float32),
        slide_attrs,
    )
    done = _layout(name, tmp_path).write("S1", empty)
    with h5py.File(done, "r") as f:
        assert f["features"].shape == (0, D)
        assert f["coords"].shape == (0, 2)


def test_the_same_numbers_in_every_layout(tmp_path: Path, slide_attrs: dict) -> None:
    result = _result(slide_attrs)
    read = []
    for name in ("flat", "trident", "clam"):
        done = _layout(name, tmp_path / name).write("S1", result)
        with h5py.File(done, "r") as f:
            read.append((f["features"][:], f["coords"][:]))
    for features, coords in read[1:]:
        np.testing.assert_array_equal(features, read[0][0])
        np.testing.assert_array_equal(coords, read[0][1])


def test_prediction_only_runs_need_flat(tmp_path: Path) -> None:
    from predictor.client.embed.config import EmbedConfig

    with pytest.raises(UsageError, match="--layout clam"):
        EmbedConfig(("http://h:1",), tmp_path, slides=(tmp_path,), mode="prediction", layout="clam")
    with pytest.raises(UsageError, match="--layout"):
        EmbedConfig(("http://h:1",), tmp_path, slides=(tmp_path,), layout="lazyslide")


def test_flat_and_trident_never_import_torch(tmp_path: Path, svs_slide: GeneratedSlide) -> None:
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from predictor.client.embed.grid import plan_tiles\n"
        "from predictor.client.embed.layouts import Layout\n"
        "from predictor.client.embed.output import SlideResult, plan_attrs\n"
        "from predictor.client.embed.slides import MppInfo, SlideReader\n"
        f"r = SlideReader.open({str(svs_slide.path)!r})\n"
        "a = plan_attrs(r, plan_tiles(r, MppInfo(0.25, 'x'), 0.5, 224, 0.05))\n"
        "res = SlideResult(np.ones((1, 4), np.float32), None, np.zeros((1, 2), np.int64),\n"
        "                  np.ones(1, np.float32), {**a, 'config_hash': 'h'})\n"
        "for name in ('flat', 'trident'):\n"
        f"    Layout(name, {str(tmp_path)!r} + '/' + name, 0.5, 224, 'm').write('S', res)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("layout", "ids"), [("trident", ["a", "b"]), ("clam", ["a.ome", "b"])])
def test_the_cli_layout_sets_how_ids_come_from_paths(
    tmp_path: Path, layout: str, ids: list[str]
) -> None:
    from predictor.client.embed.cli import build_parser, config_from_args
    from predictor.client.embed.pipeline import collect_entries

    argv = ["d/a.ome.tiff", "d/b.svs", "--url", "http://h:1", "--out", str(tmp_path)]
    config = config_from_args(build_parser().parse_args([*argv, "--layout", layout]), {})
    assert config.layout == layout
    assert [e.slide_id for e in collect_entries(config)] == ids
