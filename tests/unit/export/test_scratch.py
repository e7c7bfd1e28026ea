"""Each export compiles in a cache of its own; a killed export's folders are never reused, and removed.

A real ``python -m predictor.export`` is killed (SIGKILL) while it compiles:
its cache and staging folders stay behind, no package is written, the next
export gets new folders and removes the dead one's. A folder whose owner is
alive is left alone; a planted symlink is neither followed nor removed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from predictor.errors import CheckpointError
from predictor.export import scratch

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def inductor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path / "inductor"


def _compiling(root: Path) -> Path | None:
    """The killed-to-be export's own cache folder, once the compile has written into it."""
    for folder in root.glob("export-*"):
        if any(p.is_file() and p.name != scratch.OWNER for p in folder.rglob("*")):
            return folder
    return None


def test_a_killed_export_is_never_reused_and_its_folders_are_removed(
    inductor: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "predictor.export", "--spec", "h0-mini", "--demo"]
    proc = subprocess.Popen(
        [*argv, "--output", str(out / "h0-mini.pt2")], cwd=REPO,
        env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    root = inductor / scratch.CACHE_ROOT
    deadline = time.monotonic() + 180
    try:
        while (dead := _compiling(root)) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "never started compiling"
            time.sleep(0.05)
        staging = list(out.glob(".export-*"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert dead.is_dir() and len(staging) == 1 and not (out / "h0-mini.pt2").exists()

    with scratch.fresh_inductor_cache() as cache, scratch.owned_dir(out, ".export-") as stage:
        assert Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) == cache
        assert dead not in cache.parents and stage not in staging  # new folders, never the dead's
        assert not dead.exists() and not staging[0].exists()  # the dead export's are removed
        assert list(root.glob("export-*")) == [cache.parent]
    assert not cache.exists() and not stage.exists()  # and its own go with it
    assert not list(out.iterdir())


def test_a_live_exports_folder_is_left_alone(inductor: Path) -> None:
    with scratch.fresh_inductor_cache() as first:
        with scratch.fresh_inductor_cache() as second:
            assert first.exists() and first.parent != second.parent  # the sweep spared it
        assert first.exists() and not second.exists()


def test_planted_symlinks_are_neither_followed_nor_removed(inductor: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep me")
    root = inductor / scratch.CACHE_ROOT
    root.mkdir(parents=True)
    (root / "export-planted").symlink_to(victim)
    with scratch.fresh_inductor_cache():
        pass
    assert (victim / "keep").read_text() == "keep me" and (root / "export-planted").is_symlink()
    (root / "export-planted").unlink()
    root.rmdir()
    root.symlink_to(victim)  # the root itself planted
    with pytest.raises(CheckpointError, match="symlink"), scratch.fresh_inductor_cache():
        pass
