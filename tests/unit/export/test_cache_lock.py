"""The export's inductor-cache lock: exclusive across processes, no symlink followed."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from predictor.export import cache_lock


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path / "inductor"


def test_a_second_holder_waits_while_the_lock_is_held(cache: Path) -> None:
    with cache_lock.inductor_cache_lock() as path:
        assert path == cache / cache_lock.LOCK_NAME
        other = os.open(path, os.O_RDWR)  # a separate open file description: as another process
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    other = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on exit
    finally:
        os.close(other)


def test_a_planted_symlink_is_neither_followed_nor_truncated(cache: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    cache.mkdir()
    (cache / cache_lock.LOCK_NAME).symlink_to(victim)
    with pytest.raises(OSError), cache_lock.inductor_cache_lock():
        pass
    assert victim.read_text() == "keep me"
