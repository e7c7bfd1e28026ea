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
  fails, and its message reaches stderr escaped, as does the final line.
"""

from __future__ import annotations

import csv
import html
from pathlib import Path

import pytest

from harness import slides
from harness.embed import by_status, run_embed, status_rows
from harness.server import Server
from predictor.client.embed.status import read_status

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
