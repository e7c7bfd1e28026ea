"""Slides with unreadable tiles: held apart, never done unless the run accepts that many."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from histoserve.results.output import (
    SlideResult,
    config_hash,
    discard_incomplete,
    incomplete_dir,
    is_done,
    write_slide,
)

HASH = config_hash({"model": "h0-mini"})


def _result(n_bad: int) -> SlideResult:
    coords = np.stack([np.arange(4) * 224, np.zeros(4)], axis=1).astype(np.int64)
    bad = {"n_bad_tiles": n_bad, **({"bad_coords": coords[:n_bad] + 1000} if n_bad else {})}
    return SlideResult(
        features=np.ones((4, 8), np.float32),
        predictions=None,
        coords=coords,
        tissue_fraction=np.ones(4, np.float32),
        attrs={"config_hash": HASH, **bad},
    )


def test_an_incomplete_file_is_apart_and_marked(tmp_path: Path) -> None:
    path = write_slide(incomplete_dir(tmp_path), "S1", _result(2), complete=False)
    assert path == tmp_path / "incomplete" / "S1.h5"
    assert list(tmp_path.glob("*.h5")) == []  # a loader globbing <out>/*.h5 sees nothing
    with h5py.File(path, "r") as f:
        assert not f.attrs["complete"] and f.attrs["n_bad_tiles"] == 2
    assert not is_done(tmp_path, "S1", HASH)
    assert not is_done(incomplete_dir(tmp_path), "S1", HASH, max_bad_tiles=10)
    discard_incomplete(tmp_path, "S1")
    assert not path.exists()
    discard_incomplete(tmp_path, "S1")  # nothing there: no error


def test_a_final_file_with_holes_is_done_only_for_a_run_accepting_them(tmp_path: Path) -> None:
    write_slide(tmp_path, "S1", _result(3))
    assert not is_done(tmp_path, "S1", HASH)
    assert not is_done(tmp_path, "S1", HASH, max_bad_tiles=2)
    assert is_done(tmp_path, "S1", HASH, max_bad_tiles=3)
    write_slide(tmp_path, "S2", _result(0))
    assert is_done(tmp_path, "S2", HASH)
