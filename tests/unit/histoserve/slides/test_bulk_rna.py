"""Bulk RNA files: the accepted forms, and failures that name the manifest column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from histoserve.errors import SlideError
from histoserve.slides.bulk_rna import read_bulk_rna

COUNTS = np.array([0, 3, 12.5, 7], np.float32)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("row.csv", "0,3,12.5,7\n"),
        ("column.txt", "0\n3\n12.5\n7\n"),
        ("genes.csv", "gene,count\nA,0\nB,3\nC,12.5\nD,7\n"),
        ("genes.tsv", "A\t0\nB\t3\nC\t12.5\nD\t7\n"),
    ],
)
def test_text_forms(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    np.testing.assert_array_equal(read_bulk_rna(tmp_path / name, 4), COUNTS)


def test_npy(tmp_path: Path) -> None:
    np.save(tmp_path / "c.npy", COUNTS.astype(np.float64))
    out = read_bulk_rna(tmp_path / "c.npy", 4)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, COUNTS)


@pytest.mark.parametrize(
    ("text", "n_genes", "message"),
    [
        ("gene,count\n", 4, "holds no counts"),
        ("1,x,3,4\n", 4, "cannot read it"),
        ("1,2,3,4\n", 0, "takes no bulk RNA"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, n_genes: int, message: str) -> None:
    (tmp_path / "c.csv").write_text(text)
    with pytest.raises(SlideError, match=message):
        read_bulk_rna(tmp_path / "c.csv", n_genes)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SlideError, match="bulk_rna column"):
        read_bulk_rna(tmp_path / "nope.csv", 4)


def test_values_are_left_to_the_server(tmp_path: Path) -> None:
    """Length and values are the server's to judge (its 400 fails the slide)."""
    (tmp_path / "c.csv").write_text("1,-2,nan\n")
    out = read_bulk_rna(tmp_path / "c.csv", 4)
    assert out.shape == (3,) and out[1] == -2 and np.isnan(out[2])
