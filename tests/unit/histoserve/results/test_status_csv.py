"""status.csv: formula-like cells neutralised for spreadsheets and read back as written; no symlinks."""

from __future__ import annotations

import csv
import html
import os
from pathlib import Path

import pytest

from histoserve.errors import UsageError
from histoserve.results.status import StatusLog, read_status
from histoserve.review.report import write_report
from histoserve.text import csv_cell, csv_text

# OWASP's triggers (and the quote that marks a neutralised cell), in ids, paths and errors.
FORMULAS = [
    '=HYPERLINK("evil.example","click, me")',
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(A1:A9)",
    "'quoted",
    "\uff1dSUM(A1)",  # full-width equals sign
]


def _raw_rows(out: Path) -> list[list[str]]:
    with open(out / "status.csv", newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))[1:]


@pytest.mark.parametrize("text", FORMULAS)
def test_formula_like_cells_are_neutralised_and_read_back_as_given(
    tmp_path: Path, text: str
) -> None:
    StatusLog(tmp_path).append(text, text, "failed", 0, 0.5, text)
    raw = _raw_rows(tmp_path)[0]
    assert [raw[0], raw[1], raw[5]] == ["'" + text] * 3  # text in a spreadsheet, not a formula
    row = read_status(tmp_path)[0]
    assert (row["slide_id"], row["path"], row["error"]) == (text, text, text)


def test_tab_and_cr_in_a_path_neither_make_a_formula_nor_a_row(tmp_path: Path) -> None:
    log = StatusLog(tmp_path)
    paths = ["\t=1+1", "\r=1+1", "/d/x\r=HYPERLINK(1)\n@x"]  # a CR or LF inside: still one row
    for i, path in enumerate(paths):
        log.append(f"S{i}", path, "done", 1, 0.1)
    assert [r[1] for r in _raw_rows(tmp_path)] == ["'\t=1+1", "'\r=1+1", paths[2]]
    assert [r["path"] for r in read_status(tmp_path)] == paths


def test_plain_cells_are_written_as_they_are(tmp_path: Path) -> None:
    StatusLog(tmp_path).append("S1 (a=b)", "/d/S1.svs", "done", 12, 1.0, "note: -1 tiles? no")
    assert _raw_rows(tmp_path)[0] == ["S1 (a=b)", "/d/S1.svs", "done", "12", "1.000", "note: -1 tiles? no"]  # fmt: skip


@pytest.mark.parametrize("text", ["", "a", "'", "''", "'=", "=", "-", "x'=", "\t"])
def test_csv_cell_and_csv_text_are_inverses(text: str) -> None:
    assert csv_text(csv_cell(text)) == text


def test_the_report_shows_the_real_id(tmp_path: Path) -> None:
    slide_id = FORMULAS[0]
    StatusLog(tmp_path).append(slide_id, f"/d/{slide_id}.svs", "failed", 0, 0.1, "cannot open")
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert f"<td>{html.escape(slide_id)}<br>" in page and "'=HYPERLINK" not in page


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "outside.csv"
    victim.write_text("secret,data\n")
    return victim


def test_a_symlink_at_status_csv_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim, out = _victim(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "status.csv").symlink_to(victim)
    with pytest.raises(UsageError, match=r"status\.csv is a symbolic link.*remove it"):
        StatusLog(out)
    with pytest.raises(UsageError, match="symbolic link"):  # nor is it read into the report
        read_status(out)
    assert victim.read_text() == "secret,data\n"


def test_a_symlink_planted_after_the_start_is_refused_too(tmp_path: Path) -> None:
    victim, out = _victim(tmp_path), tmp_path / "out"
    out.mkdir()
    log = StatusLog(out)
    log.append("S1", "/d/S1.svs", "done", 1, 0.1)
    (out / "status.csv").unlink()
    (out / "status.csv").symlink_to(victim)
    with pytest.raises(UsageError, match="symbolic link"):
        log.append("S2", "/d/S2.svs", "done", 1, 0.1)
    assert victim.read_text() == "secret,data\n"


def test_a_fifo_at_status_csv_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "status.csv")
    with pytest.raises(UsageError, match="not a regular file"):
        StatusLog(tmp_path)
    with pytest.raises(UsageError, match="not a regular file"):
        read_status(tmp_path)
