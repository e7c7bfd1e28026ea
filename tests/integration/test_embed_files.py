"""``histoserve embed`` and hostile names in ``--out``: no symlink followed, no formula, no escape code.

Real parts only: a generated tiled TIFF (``harness.slides``) copied under
hostile names, the demo embedding package served on loopback, the CLI in its
own interpreter.

- a symlink planted at ``.claims/<id>.lock`` fails that slide alone; its
  target outside ``--out`` is unchanged and the other slide is done;
- a symlink planted at ``status.csv`` is refused before any slide (exit 2);
  its target is unchanged;
- a slide named ``=HYPERLINK(...)`` is done, its ``status.csv`` cell starts
  with ``'`` (text in a spreadsheet), ``read_status`` and ``report.html`` show
  the real id;
- a slide path with an escape code in a folder name (the file is not a slide)
  fails, and its message reaches stderr escaped, as does the final line;
- ``incomplete/`` and ``pt_files/`` planted as symlinks are refused before any
  slide (exit 2), their targets unchanged; ``--out`` itself may be a symlink;
- a FIFO planted at a done file's name or in ``qc/`` never hangs the run;
- a malformed ``qc/<id>.json`` or ``status.csv`` line is a warning naming the
  file: the run and its report finish.
"""

from __future__ import annotations

import csv
import html
import json
import os
import stat
from pathlib import Path

import pytest

from harness import slides
from harness.embed import by_status, run_embed, status_rows
from harness.server import Server
from histoserve.results.status import read_status

pytestmark = pytest.mark.integration
RUN = ("--tissue", "none", "--batch-size", "8")
VICTIM_TEXT = "a user's notes, outside --out\n"
FORMULA_ID = '=HYPERLINK("evil.example","click, here")'


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> slides.GeneratedSlide:
    """A small generic TIFF (0.5 um/px: 224 px tiles at the model's scale)."""
    return slides.generic_tiff(tmp_path_factory.mktemp("files-slides") / "s.tiff")


def _copy(slide: slides.GeneratedSlide, folder: Path, slide_id: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return slides.copy_slide(slide, folder / f"{slide_id}.tiff").path


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "home" / "notes.txt"
    victim.parent.mkdir()
    victim.write_text(VICTIM_TEXT)
    return victim


def test_a_symlink_planted_at_a_lock_fails_that_slide_and_leaves_its_target(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    victim, out = _victim(tmp_path), tmp_path / "out"
    paths = [_copy(slide, tmp_path / "in", name) for name in ("locked", "other")]
    (out / ".claims").mkdir(parents=True)
    (out / ".claims" / "locked.lock").symlink_to(victim)
    result = run_embed(*paths, "--url", embedding_server.base, "--out", out, *RUN)
    assert result.returncode == 1, result.stderr
    assert victim.read_text() == VICTIM_TEXT
    rows = status_rows(out)
    assert by_status(rows) == {"failed": ["locked"], "done": ["other"]}
    assert "locked.lock is a symbolic link" in rows[0]["error"] and "remove it" in rows[0]["error"]
    assert (out / "other.h5").is_file() and not (out / "locked.h5").exists()
    assert "Traceback" not in result.stderr


def test_a_symlink_planted_at_status_csv_is_refused_and_leaves_its_target(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    victim, out = _victim(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "status.csv").symlink_to(victim)
    path = _copy(slide, tmp_path / "in", "s1")
    result = run_embed(path, "--url", embedding_server.base, "--out", out, *RUN)
    assert result.returncode == 2, result.stderr
    assert "status.csv is a symbolic link" in result.stderr and "Traceback" not in result.stderr
    assert victim.read_text() == VICTIM_TEXT
    assert not list(out.glob("*.h5"))  # refused before any slide


def test_a_formula_like_slide_id_is_text_in_status_csv_and_real_in_the_report(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    path = _copy(slide, tmp_path / "in", FORMULA_ID)
    result = run_embed(path, "--url", embedding_server.base, "--out", out, *RUN)
    assert result.returncode == 0, result.stderr
    assert (out / f"{FORMULA_ID}.h5").is_file()
    with open(out / "status.csv", newline="", encoding="utf-8") as handle:
        raw = list(csv.reader(handle))
    assert raw[1][:3] == ["'" + FORMULA_ID, str(path), "done"]  # a spreadsheet shows the text
    assert [row["slide_id"] for row in status_rows(out)] == ["'" + FORMULA_ID]
    assert [row["slide_id"] for row in read_status(out)] == [FORMULA_ID]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert f"<td>{html.escape(FORMULA_ID)}<br>" in page and "'=HYPERLINK" not in page


def test_escape_codes_in_a_path_reach_stderr_escaped(
    embedding_server: Server, tmp_path: Path
) -> None:
    folder = tmp_path / "ev\x1b[2Jil\x07"
    folder.mkdir()
    bad = folder / "bad.svs"
    bad.write_bytes(b"not a slide")
    out = tmp_path / "out\x1b]0;title\x07"
    result = run_embed(bad, "--url", embedding_server.base, "--out", out, *RUN)
    assert result.returncode == 1, result.stderr
    err = result.stderr
    assert "\x1b" not in err and "\x07" not in err
    assert "[1/1] bad: failed" in err and "cannot open slide" in err
    assert "ev\\x1b[2Jil\\x07/bad.svs" in err  # the progress line: its message, escaped
    assert "out\\x1b]0;title\\x07/status.csv" in err  # the final line
    assert by_status(status_rows(out)) == {"failed": ["bad"]}


def test_symlinked_folders_inside_out_are_refused_and_out_itself_may_be_one(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    """``incomplete/`` and ``pt_files/`` planted as symlinks: nothing outside ``--out`` changes."""
    victim = tmp_path / "home"
    victim.mkdir()
    for name in ("s1.h5", "s1.pt"):
        (victim / name).write_text(VICTIM_TEXT)
    disk = tmp_path / "disk"
    disk.mkdir()
    out = tmp_path / "out"
    out.symlink_to(disk)  # --out itself a symlink, as users point it at another disk
    (out / "incomplete").symlink_to(victim)
    (out / "pt_files").symlink_to(victim)
    path = _copy(slide, tmp_path / "in", "s1")
    args = (path, "--url", embedding_server.base, "--out", out, *RUN, "--layout", "clam")
    result = run_embed(*args)
    assert result.returncode == 2, result.stderr
    assert "out/incomplete is a symbolic link" in result.stderr and "remove it" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["s1.h5", "s1.pt"]
    assert all(p.read_text() == VICTIM_TEXT for p in victim.iterdir())
    (out / "incomplete").unlink()
    (out / "pt_files").unlink()
    result = run_embed(*args)
    assert result.returncode == 0, result.stderr
    assert (disk / "pt_files" / "s1.pt").is_file() and (disk / "h5_files" / "s1.h5").is_file()


def test_a_fifo_planted_at_a_done_file_is_replaced_never_waited_on(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    """A ``mkfifo out/s1.h5`` (or in ``qc/``) hung every run for good before."""
    out = tmp_path / "out"
    (out / "qc").mkdir(parents=True)
    os.mkfifo(out / "s1.h5")
    os.mkfifo(out / "qc" / "planted.json")
    path = _copy(slide, tmp_path / "in", "s1")
    result = run_embed(path, "--url", embedding_server.base, "--out", out, *RUN, timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert by_status(status_rows(out)) == {"done": ["s1"]}
    assert stat.S_ISREG(os.lstat(out / "s1.h5").st_mode)
    assert "qc/planted.json left out of the report" in result.stderr
    assert (out / "report.html").is_file() and "Traceback" not in result.stderr


def test_malformed_files_in_out_leave_the_run_and_its_report_whole(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    """A ``qc/<id>.json`` of other types and a line a full disk cut short: a warning each."""
    out = tmp_path / "out"
    (out / "qc").mkdir(parents=True)
    facts = {"slide_id": "old", "n_kept": 3, "tissue_area_mm2": "2.0"}
    (out / "qc" / "old.json").write_text(json.dumps(facts))
    (out / "status.csv").write_text(
        "slide_id,path,status,n_tiles,seconds,error\nA,/x,done,3,1.0,\n\nB\n"
    )
    path = _copy(slide, tmp_path / "in", "s1")
    result = run_embed(path, "--url", embedding_server.base, "--out", out, *RUN)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "TypeError" not in result.stderr
    assert "qc/old.json left out of the report" in result.stderr
    assert "status.csv: 1 malformed line left out of the report (line 4)" in result.stderr
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<td>s1<br>" in page and "<td>A<br>" in page and "<td>old<br>" not in page
