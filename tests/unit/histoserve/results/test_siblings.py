"""A two-file layout's done file records its sibling: checked by a stat, read only when it changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from histoserve.results.siblings import SIBLINGS_ATTR, sibling_problem, sibling_record


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """``pt_files/S1.pt`` and the record a done file would carry of it."""
    sibling = tmp_path / "pt_files" / "S1.pt"
    sibling.parent.mkdir()
    sibling.write_bytes(b"features of run A" * 1000)
    return sibling, sibling_record(tmp_path, sibling)


def _with_digest(record: dict[str, str], digest: str) -> dict[str, str]:
    """The record with another digest and the same stat: what only a read could tell apart."""
    entries = json.loads(record[SIBLINGS_ATTR])
    for entry in entries.values():
        entry["sha256"] = digest
    return {SIBLINGS_ATTR: json.dumps(entries)}


def test_an_untouched_sibling_is_trusted_by_its_stat_without_reading_it(
    tmp_path: Path, pair: tuple[Path, dict[str, str]]
) -> None:
    sibling, record = pair
    assert sibling_problem(tmp_path, sibling, record) == ""
    wrong = _with_digest(record, "0" * 64)
    assert sibling_problem(tmp_path, sibling, wrong) == ""  # not read: the stat says untouched
    os.utime(sibling, ns=(1, 1))  # touched: now the digest decides
    assert "pt_files/S1.pt is not the file its done file recorded" in sibling_problem(
        tmp_path, sibling, wrong
    )
    assert sibling_problem(tmp_path, sibling, record) == ""  # same bytes: still the file


def test_a_sibling_replaced_or_rewritten_in_place_is_read_and_refused(
    tmp_path: Path, pair: tuple[Path, dict[str, str]]
) -> None:
    sibling, record = pair
    replaced = sibling.with_name("new.pt")
    replaced.write_bytes(b"features of run B" * 1000)  # the same size, another inode
    replaced.replace(sibling)
    assert "is not the file its done file recorded" in sibling_problem(tmp_path, sibling, record)
    record = sibling_record(tmp_path, sibling)  # of B, in place
    st = os.stat(sibling)
    with open(sibling, "r+b") as handle:  # rewritten in place, its mtime set back (cp -p)
        handle.write(b"features of run C")
    os.utime(sibling, ns=(st.st_atime_ns, st.st_mtime_ns))
    while os.stat(sibling).st_ctime_ns == st.st_ctime_ns:  # ctime ticks coarsely: next tick
        os.utime(sibling, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(sibling).st_mtime_ns == st.st_mtime_ns  # only the ctime tells
    assert "is not the file" in sibling_problem(tmp_path, sibling, record)


def test_a_fifo_or_symlink_at_the_sibling_is_never_trusted_nor_opened_blocking(
    tmp_path: Path, pair: tuple[Path, dict[str, str]]
) -> None:
    sibling, record = pair
    kept = tmp_path / "kept.pt"
    sibling.replace(kept)
    sibling.symlink_to(kept)  # the very bytes, through a symlink
    assert "pt_files/S1.pt cannot be read (" in sibling_problem(tmp_path, sibling, record)
    sibling.unlink()
    os.mkfifo(sibling)
    problem = sibling_problem(tmp_path, sibling, record)
    assert "pt_files/S1.pt cannot be read" in problem and "FIFO" in problem
    with pytest.raises(OSError, match="FIFO"):
        sibling_record(tmp_path, sibling)


def test_no_record_or_the_first_format_still_decides_by_the_digest(
    tmp_path: Path, pair: tuple[Path, dict[str, str]]
) -> None:
    sibling, record = pair
    assert "records no digest of pt_files/S1.pt" in sibling_problem(tmp_path, sibling, {})
    junk = {SIBLINGS_ATTR: "{"}
    assert "records no digest" in sibling_problem(tmp_path, sibling, junk)
    digest = json.loads(record[SIBLINGS_ATTR])["pt_files/S1.pt"]["sha256"]
    first = {SIBLINGS_ATTR: json.dumps({"pt_files/S1.pt": digest})}
    assert sibling_problem(tmp_path, sibling, first) == ""
    other = {SIBLINGS_ATTR: json.dumps({"pt_files/S1.pt": "0" * 64})}
    assert "is not the file" in sibling_problem(tmp_path, sibling, other)
