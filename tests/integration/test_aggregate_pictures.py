"""Issue 33, case 3: a slide's pictures are of the result beside them; ``aggregate --slides DIR``.

Real everything: a generated slide embedded by ``histoserve embed --slide-model``
against the session's embedding server and the real ``abmil-demo`` head
(the session's ``head_server``), then ``histoserve
aggregate`` in its own interpreter (:func:`harness.embed.run_aggregate`).
A run "killed between the result and its pictures" is that process ending
itself with ``os._exit`` the moment it starts drawing the heatmap (nothing
cleaned up, as under SIGKILL); a picture that cannot be written is the top
tiles' sheet raising ENOSPC in that process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from harness import slides
from harness.embed import run_aggregate, run_embed
from harness.server import Server
from histoserve.heads.pictures import picture_files, recorded_answer
from histoserve.heads.result_file import answer_sha256
from histoserve.heads.table import read_table

pytestmark = pytest.mark.integration
MODEL = "abmil-demo"
KILLED_WHILE_DRAWING = (
    "import os, histoserve.heads.heatmap as h; h.render_heatmap = lambda *a, **k: os._exit(137)"
)
DISK_FULL_FOR_TOP_TILES = (
    "import errno, histoserve.heads.pictures as p\n"
    "def full(*a, **k): raise OSError(errno.ENOSPC, 'No space left on device')\n"
    "p.contact_sheet = full"
)


@pytest.fixture(scope="module")
def embedded(
    tmp_path_factory: pytest.TempPathFactory,
    head_server: Server,
    embedding_server: Server,
) -> tuple[Path, Path]:
    """A slide embedded with the slide model (result and pictures): the slide and the folder."""
    root = tmp_path_factory.mktemp("embedded")
    slide = slides.aperio_svs(root / "wsi" / "case-1.svs").path
    out = root / "features"
    run = run_embed(
        slide, "--url", embedding_server.base, "--out", out, "--slide-model", MODEL,
        "--slide-url", head_server.base, "--batch-size", "8",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return slide, out


def _copy(embedded: tuple[Path, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(embedded[1], tmp_path / "features", symlinks=True))


def _aggregate(out: Path, head_server: Server, *args: str, **kw) -> str:
    run = run_aggregate(out.absolute(), "--model", MODEL, "--url", head_server.base, *args, **kw)
    assert run.returncode == 0, run.stderr
    return run.stderr


def _reembed(features: Path) -> None:
    """The features file rewritten with other values: another answer from the head."""
    with h5py.File(features, "r+") as f:
        f["features"][...] = f["features"][()] * 0.5 + 0.1


def _result(root: Path) -> dict[str, np.ndarray]:
    with h5py.File(root / f"slide_features_{MODEL}" / "case-1.h5") as f:
        return {k: f[k][()] for k in f}


def _agree(out: Path, root: Path, tiling: str = "", top: bool = True) -> None:
    """The slide's pictures are all there and all of the result in ``root``."""
    result = _result(root)
    digest = answer_sha256(result)
    files = picture_files(out, "case-1", MODEL, tiling)
    assert recorded_answer(files.heatmap) == digest
    assert recorded_answer(files.top) == digest if top else not files.top.exists()
    collection = json.loads(files.geojson.read_text())
    assert collection["properties"]["answer_sha256"] == digest
    drawn = [f["properties"]["measurements"]["attention"] for f in collection["features"]]
    np.testing.assert_allclose(drawn, result["attention"], rtol=1e-6)


def _no_picture_of_another_result(out: Path) -> None:
    """Whatever pictures are there show the result beside them (none is fine)."""
    result = _result(out)
    files = picture_files(out, "case-1", MODEL)
    for jpeg in (files.heatmap, files.top):
        assert not jpeg.exists() or recorded_answer(jpeg) == answer_sha256(result)
    if files.geojson.exists():
        collection = json.loads(files.geojson.read_text())
        drawn = [f["properties"]["measurements"]["attention"] for f in collection["features"]]
        np.testing.assert_allclose(drawn, result["attention"], rtol=1e-6)


def _infers(head_server: Server) -> int:
    return head_server.log().count(f"/v2/models/{MODEL}/infer")


def test_a_run_killed_while_drawing_leaves_no_picture_of_another_result_and_resume_redraws(
    embedded: tuple[Path, Path],
    head_server: Server,
    tmp_path: Path,
) -> None:
    """The result used to be renamed into place first: killed then, old pictures stayed for good."""
    out = _copy(embedded, tmp_path)
    _agree(out, out)
    _reembed(out / "case-1.h5")
    killed = run_aggregate(
        out, "--model", MODEL, "--url", head_server.base, before=KILLED_WHILE_DRAWING
    )
    assert killed.returncode == 137, killed.stderr
    _no_picture_of_another_result(out)
    assert list(out.rglob(".*.tmp"))  # what the killed run was writing
    said = _aggregate(out, head_server)
    assert "case-1: done" in said
    _agree(out, out)
    assert not list(out.rglob(".*.tmp"))
    assert _result(out)["prediction"].tolist() != _result(embedded[1])["prediction"].tolist()


def test_pictures_that_cannot_be_drawn_leave_none_and_resume_redraws_them_without_the_head(
    embedded: tuple[Path, Path],
    head_server: Server,
    tmp_path: Path,
) -> None:
    out = _copy(embedded, tmp_path)
    _reembed(out / "case-1.h5")
    said = _aggregate(out, head_server, before=DISK_FULL_FOR_TOP_TILES)
    assert "case-1: done (no pictures: OSError: [Errno 28] No space left on device)" in said
    assert not any(p.exists() for p in picture_files(out, "case-1", MODEL).all())
    asked = _infers(head_server)
    said = _aggregate(out, head_server)
    assert "case-1: skipped" in said and "pictures redrawn from its result" in said
    assert _infers(head_server) == asked  # the head was not asked again
    _agree(out, out)


def test_a_no_qc_rerun_keeps_current_pictures_and_removes_stale_ones(
    embedded: tuple[Path, Path],
    head_server: Server,
    tmp_path: Path,
) -> None:
    out = _copy(embedded, tmp_path)
    assert "case-1: skipped (already done" in _aggregate(out, head_server, "--no-qc")
    _agree(out, out)  # of this very result: kept
    _reembed(out / "case-1.h5")
    assert "case-1: done" in _aggregate(out, head_server, "--no-qc")
    assert not any(p.exists() for p in picture_files(out, "case-1", MODEL).all())
    (row,) = read_table(out)
    assert float(row["class_0"]) == pytest.approx(float(_result(out)["prediction"][0]), rel=1e-5)
    asked = _infers(head_server)
    assert "pictures redrawn from its result" in _aggregate(out, head_server)  # qc again: drawn
    assert _infers(head_server) == asked
    _agree(out, out)


def test_two_trident_overlap_runs_into_one_folder_keep_their_own_pictures_and_rows(
    embedded: tuple[Path, Path],
    head_server: Server,
    embedding_server: Server,
    tmp_path: Path,
) -> None:
    out = tmp_path / "job"
    common = ("--url", embedding_server.base, "--out", out, "--layout", "trident",
              "--slide-model", MODEL, "--slide-url", head_server.base,
              "--batch-size", "8")  # fmt: skip
    first = run_embed(embedded[0], *common)
    assert first.returncode == 0, first.stderr
    second = run_embed(embedded[0], *common, "--overlap", "112", "--force")  # other settings
    assert second.returncode == 0, second.stderr
    tilings = sorted(p.name for p in out.glob("*px_overlap"))
    assert len(tilings) == 2 and tilings[1].endswith("_112px_overlap")
    rows = read_table(out)
    assert [r["tiling"] for r in rows] == tilings
    for row, tiling in zip(rows, tilings, strict=True):
        _agree(out, out / tiling, tiling)
        prediction = _result(out / tiling)["prediction"]
        assert [float(row[c]) for c in ("class_0", "class_1")] == pytest.approx(
            prediction.tolist(), rel=1e-5
        )
    assert rows[0]["class_0"] != rows[1]["class_0"]  # two results, not one twice
    report = (out / "report.html").read_text()
    assert all(picture_files(out, "case-1", MODEL, t).heatmap.name in report for t in tilings)


def test_slides_dir_draws_the_slide_found_there_only_when_it_is_the_one_recorded(
    embedded: tuple[Path, Path],
    head_server: Server,
    tmp_path: Path,
) -> None:
    slide, _ = embedded
    out = _copy(embedded, tmp_path)
    moved, other, cwd = (tmp_path / d for d in ("moved", "other", "elsewhere"))
    for folder in (moved, other, cwd):
        folder.mkdir()
    shutil.copyfile(slide, moved / "case-1.svs")
    with h5py.File(out / "case-1.h5") as f:
        size = int(f.attrs["level0_width"]), int(f.attrs["level0_height"])
    slides.write_slide(other / "case-1.svs", slides.SlideSpec(*size, boxes=()))  # bare glass
    files = picture_files(out, "case-1", MODEL)

    said = _aggregate(out, head_server, "--force", "--slides", "../moved", cwd=cwd)
    assert "drawn without its slide" not in said
    _agree(out, out)  # the top tiles are read only from a verified slide
    said = _aggregate(out, head_server, "--force", "--slides", str(other), cwd=cwd)
    assert "heatmap drawn without its slide: case-1.svs is not the slide the features" in said
    _agree(out, out, top=False)
    with h5py.File(out / "case-1.h5", "r+") as f:  # as TRIDENT's and CLAM's files: no slide named
        del f.attrs["slide_identity"], f.attrs["slide_path"]
    _aggregate(out, head_server)
    assert not files.top.exists()  # nothing to open without --slides
    _aggregate(out, head_server, "--force", "--slides", "../moved", cwd=cwd)
    _agree(out, out)  # found by its slide id, the tiles inside it
