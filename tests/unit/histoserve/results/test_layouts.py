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
from histoserve.errors import SlideError, UsageError
from histoserve.results.claims import ClaimStore
from histoserve.results.layouts import (
    Layout,
    slide_id_from_path,
    trident_encoder,
    trident_magnification,
)
from histoserve.results.output import SlideResult, config_hash, plan_attrs
from histoserve.results.siblings import SIBLINGS_ATTR
from histoserve.slides.grid import plan_tiles
from histoserve.slides.identity import IDENTITY_ATTR, SlideIdentity, slide_identity
from histoserve.slides.manifest import MAX_SLIDE_ID_BYTES, check_slide_id
from histoserve.slides.readers import MppInfo, SlideReader

REPO = Path(__file__).resolve().parents[3]
HASH = config_hash({"model": "h-optimus-0", "layout": "x"})
D = 8


@pytest.fixture(scope="module")
def identity(svs_slide: GeneratedSlide) -> SlideIdentity:
    """The identity of the slide the results below are "made from"."""
    return slide_identity(svs_slide.path)


@pytest.fixture(scope="module")
def slide_attrs(svs_slide: GeneratedSlide, identity: SlideIdentity) -> dict:
    """A real plan that resizes: 1 um/px tiles from a 0.25 um/px slide with levels 1/2/8.

    No level is at 1 um/px, so 448 px are read at level 1 (2x) and resized to 224.
    """
    with SlideReader.open(svs_slide.path) as reader:
        plan = plan_tiles(reader, MppInfo(0.25, "openslide.mpp"), 1.0, 224, 0.05)
        attrs = {**plan_attrs(reader, plan), "slide_id": "S1", "config_hash": HASH}
        return {**attrs, IDENTITY_ATTR: identity.to_attr()}


def _result(attrs: dict, n: int = 5, seed: int = 1) -> SlideResult:
    rng = np.random.default_rng(seed)
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
    tmp_path: Path, slide_attrs: dict, identity: SlideIdentity, name: str
) -> None:
    layout = _layout(name, tmp_path)
    assert not layout.is_done("S1", HASH, identity)
    layout.write("S1", _result(slide_attrs))
    assert layout.is_done("S1", HASH, identity)
    assert not layout.is_done("S1", config_hash({"other": 1}), identity)
    assert not list(tmp_path.rglob("*.tmp"))
    first = layout.files("S1")[0]
    first.unlink()
    assert not layout.is_done("S1", HASH, identity)


@pytest.mark.parametrize("name", ["flat", "trident", "clam"])
def test_a_done_file_from_another_slide_is_never_done(
    tmp_path: Path,
    slide_attrs: dict,
    identity: SlideIdentity,
    tiff_slide: GeneratedSlide,
    name: str,
) -> None:
    layout = _layout(name, tmp_path)
    layout.write("S1", _result(slide_attrs))
    other = layout.check_done("S1", HASH, slide_identity(tiff_slide.path))
    assert not other.done and other.reason.startswith("slide changed since the done file (path ")
    moved = SlideIdentity("/new/mount/a.svs", identity.size, 7, identity.digest)
    assert layout.check_done("S1", HASH, moved).done  # moved, not changed
    older = {k: v for k, v in slide_attrs.items() if k != IDENTITY_ATTR}  # an older histoserve
    layout.write("S2", _result({**older, "slide_id": "S2"}))
    legacy = layout.check_done("S2", HASH, identity)
    assert not legacy.done and "records no slide identity" in legacy.reason


# A run of settings B killed between its two renames: B's sibling is in place, B's
# done file is not; the done file there is A's. torch is there for the clam layout.
_KILLED_COMMIT = """
import os, signal, sys
import numpy as np
from pathlib import Path
import histoserve.atomic as atomic
import histoserve.results.output as out
from histoserve.results.layouts import Layout
renames, replace = [], os.replace
def replace_then_die(a, b, **dir_fds):
    renames.append(b)
    if len(renames) == 2:  # the done file's rename: the process dies first
        os.kill(os.getpid(), signal.SIGKILL)
    replace(a, b, **dir_fds)
atomic.os.replace = replace_then_die
name, folder, attrs = sys.argv[1], Path(sys.argv[2]), {"config_hash": "B", "level0_mpp": 0.25,
    "patch_size_level0": 896, "level0_width": 3584, "level0_height": 2688, "read_downsample": 2.0,
    "read_level_width": 1792, "read_level_height": 1344, "read_size": 448, "read_level": 1,
    "tile_size": 224}
n = 3
result = out.SlideResult(np.full((n, 8), 7, np.float32), None,
    np.stack([np.arange(n) * 448, np.zeros(n)], 1).astype(np.int64), np.ones(n, np.float32), attrs)
Layout(name, folder, 1.0, 224, "h-optimus-0", 8).write("S1", result)
"""


@pytest.mark.parametrize("name", ["trident", "clam"])
def test_a_pair_torn_by_a_killed_commit_is_never_done(
    tmp_path: Path, slide_attrs: dict, identity: SlideIdentity, name: str
) -> None:
    layout = _layout(name, tmp_path)
    layout.write("S1", _result(slide_attrs))
    sibling, done = layout.files("S1")
    before = sibling.read_bytes(), done.read_bytes()
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_COMMIT, name, str(tmp_path)], cwd=REPO, check=False
    )
    assert proc.returncode == -9
    assert sibling.read_bytes() != before[0] and done.read_bytes() == before[1]  # torn
    check = layout.check_done("S1", HASH, identity)
    rel = sibling.relative_to(tmp_path).as_posix()
    assert not check.done and f"{rel} is not the file its done file recorded" in check.reason
    assert not layout.is_done("S1", "B", identity)  # nor is B's run: its done file never came
    layout.write("S1", _result(slide_attrs))  # the slide embedded again: whole
    assert layout.is_done("S1", HASH, identity)


@pytest.mark.parametrize("name", ["trident", "clam"])
def test_the_done_file_records_its_siblings_digests(
    tmp_path: Path, slide_attrs: dict, identity: SlideIdentity, name: str
) -> None:
    import hashlib
    import json

    layout = _layout(name, tmp_path)
    sibling, done = layout.files("S1")
    layout.write("S1", _result(slide_attrs))
    with h5py.File(done, "r") as f:
        recorded = json.loads(f.attrs[SIBLINGS_ATTR])
    st = sibling.stat()
    assert recorded == {
        sibling.relative_to(tmp_path).as_posix(): {
            "sha256": hashlib.sha256(sibling.read_bytes()).hexdigest(),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns,
            "ino": st.st_ino,
        }
    }
    with h5py.File(done, "a") as f:  # an older histoserve's pair: no digests
        del f.attrs[SIBLINGS_ATTR]
    check = layout.check_done("S1", HASH, identity)
    assert not check.done and "records no digest of" in check.reason


@pytest.mark.parametrize("name", ["flat", "trident", "clam"])
def test_a_failing_check_before_the_commit_leaves_no_done_file(
    tmp_path: Path, slide_attrs: dict, identity: SlideIdentity, name: str
) -> None:
    """The run's "slide unchanged?" runs before the done file's rename: its error leaves none."""
    layout = _layout(name, tmp_path)
    calls = []

    def changed() -> None:
        calls.append(sorted(p.name for p in tmp_path.rglob("*") if p.is_file()))
        raise SlideError("the slide changed while it was embedded")

    with pytest.raises(SlideError, match="changed while it was embedded"):
        layout.write("S1", _result(slide_attrs), changed)
    assert len(calls) == 1 and "S1.h5" not in calls[0]  # called once, before the rename
    assert not layout.is_done("S1", HASH, identity) and not list(tmp_path.rglob("*.tmp"))
    with pytest.raises(SlideError):
        layout.write_incomplete("S1", _result(slide_attrs), changed)
    assert not (tmp_path / "incomplete" / "S1.h5").exists()


@pytest.mark.parametrize(
    ("name", "folder"), [("clam", "pt_files"), ("flat", "incomplete"), ("trident", "")]
)
def test_a_symlinked_folder_inside_out_is_refused_and_its_target_kept(
    tmp_path: Path, slide_attrs: dict, name: str, folder: str
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    kept = dict.fromkeys(("S1.pt", "S1.h5", "S1_patches.h5"), "a user's file")
    for file, text in kept.items():
        (victim / file).write_text(text)
    out = tmp_path / "out"
    layout = _layout(name, out)
    folder = folder or layout.coords_dir.name  # trident's job folder
    out.mkdir()
    (out / folder).symlink_to(victim)
    with pytest.raises(UsageError, match=rf"out/{folder} is a symbolic link.*remove it"):
        layout.check_folders()
    with pytest.raises(SlideError, match=rf"{folder} is a symbolic link"):  # planted mid-run
        layout.write("S1", _result(slide_attrs))
        layout.discard_incomplete("S1")
    with pytest.raises(SlideError, match=rf"{folder} is a symbolic link"):
        layout.remove_stale_temps("S1")
    assert {p.name: p.read_text() for p in victim.iterdir()} == kept


def test_a_symlinked_qc_folder_is_refused_when_the_run_writes_qc(tmp_path: Path) -> None:
    (tmp_path / "qc").symlink_to(tmp_path)
    layout = _layout("flat", tmp_path)
    layout.check_folders()  # --no-qc: qc is never written
    with pytest.raises(UsageError, match=r"qc is a symbolic link"):
        layout.check_folders("qc")


def test_the_longest_id_fits_every_file_a_slide_gets(
    tmp_path: Path, slide_attrs: dict, identity: SlideIdentity
) -> None:
    """On the real file system: an id of the limit writes everything; one byte more cannot."""
    longest = check_slide_id("é" * (MAX_SLIDE_ID_BYTES // 2))  # 2 bytes of UTF-8 each
    assert len(longest.encode()) == MAX_SLIDE_ID_BYTES
    for name in ("flat", "trident", "clam"):
        layout = _layout(name, tmp_path / name)
        layout.write(longest, _result({**slide_attrs, "slide_id": longest}))
        assert layout.is_done(longest, HASH, identity)
    claim = ClaimStore(tmp_path).try_claim(longest)
    assert claim is not None and claim.held
    claim.release()
    job = _layout("trident", tmp_path / "trident").coords_dir
    with pytest.raises(OSError, match="File name too long"):
        (job / "patches" / f"{longest}x_patches.h5").write_bytes(b"")


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
    from histoserve.embedding.config import EmbedConfig

    with pytest.raises(UsageError, match="--layout clam"):
        EmbedConfig(("http://h:1",), tmp_path, slides=(tmp_path,), mode="prediction", layout="clam")
    with pytest.raises(UsageError, match="--layout"):
        EmbedConfig(("http://h:1",), tmp_path, slides=(tmp_path,), layout="lazyslide")


def test_flat_and_trident_never_import_torch(tmp_path: Path, svs_slide: GeneratedSlide) -> None:
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from histoserve.slides.grid import plan_tiles\n"
        "from histoserve.results.layouts import Layout\n"
        "from histoserve.results.output import SlideResult, plan_attrs\n"
        "from histoserve.slides.readers import MppInfo, SlideReader\n"
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
    from histoserve.commands.embed import build_parser, config_from_args
    from histoserve.embedding.pipeline import collect_entries

    argv = ["d/a.ome.tiff", "d/b.svs", "--url", "http://h:1", "--out", str(tmp_path)]
    config = config_from_args(build_parser().parse_args([*argv, "--layout", layout]), {})
    assert config.layout == layout
    assert [e.slide_id for e in collect_entries(config)] == ids
