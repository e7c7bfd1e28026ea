"""Segments: allocated whole (a full /dev/shm is a start-up error), swept only when nobody holds them."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from predictor.multiprocess.segments import PREFIX, Segment, ShmTooSmall, remove_stale_segments


def test_every_page_is_allocated_at_creation(tmp_path: Path) -> None:
    segment = Segment.create(1 << 20, tmp_path)
    try:
        assert os.stat(segment.path).st_blocks * 512 >= 1 << 20  # not a sparse file
    finally:
        segment.close(unlink=True)
    assert not segment.path.exists()


def _create_under_a_file_size_limit(folder: Path, size: int) -> subprocess.CompletedProcess:
    """Creates a segment in a child whose files may not grow past 64 KiB (as a full tmpfs)."""
    code = (
        "import sys; from pathlib import Path\n"
        "from predictor.multiprocess.segments import Segment, ShmTooSmall\n"
        f"try: Segment.create({size}, Path({str(folder)!r}))\n"
        "except ShmTooSmall as exc: print(exc); sys.exit(3)\n"
    )

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    return subprocess.run(
        [sys.executable, "-c", code], preexec_fn=limit, capture_output=True, text=True, check=False
    )


def test_a_filesystem_too_small_is_one_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    done = _create_under_a_file_size_limit(tmp_path, 8 << 20)
    assert done.returncode == 3, done.stderr
    assert "shared-memory slab of 8388608 bytes (8 MiB" in done.stdout
    assert "shm.sizeLimit" in done.stdout
    assert not list(tmp_path.iterdir())
    assert issubclass(ShmTooSmall, Exception)


def test_the_sweep_removes_unheld_segments_only(tmp_path: Path) -> None:
    held = Segment.create(4096, tmp_path)
    stale = tmp_path / f"{PREFIX}{'0' * 32}"
    stale.write_bytes(b"\0" * 4096)  # left by a killed container: nobody holds its lock
    other = tmp_path / "someone-elses"
    other.write_bytes(b"x")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / f"{PREFIX}{'1' * 32}").symlink_to(victim)
    try:
        assert remove_stale_segments(tmp_path) == [stale.name]
        assert held.path.exists() and other.exists() and victim.read_bytes() == b"keep"
    finally:
        held.close(unlink=True)


def test_a_segment_of_a_killed_process_is_swept(tmp_path: Path) -> None:
    code = (
        "import os, sys; from pathlib import Path\n"
        "from predictor.multiprocess.segments import Segment\n"
        f"Segment.create(4096, Path({str(tmp_path)!r})); print('made', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "made"
    assert remove_stale_segments(tmp_path) == []  # alive: its lock is held
    child.kill()
    child.wait()
    assert len(remove_stale_segments(tmp_path)) == 1
    assert not list(tmp_path.iterdir())


def test_attach_refuses_names_that_are_not_ours(tmp_path: Path) -> None:
    for name in ("passwd", f"../{PREFIX}x", f"{PREFIX}a/b"):
        with pytest.raises(ValueError, match="not a histoserve segment"):
            Segment.attach(name, tmp_path)


def test_the_sweep_leaves_a_folder_with_our_prefix_alone(tmp_path: Path) -> None:
    (tmp_path / f"{PREFIX}{'2' * 32}").mkdir()
    assert remove_stale_segments(tmp_path) == []
    assert (tmp_path / f"{PREFIX}{'2' * 32}").is_dir()


def test_a_folder_we_cannot_write_is_a_start_up_error(tmp_path: Path) -> None:
    from predictor.errors import StartupError

    with pytest.raises(StartupError, match="cannot create a shared-memory segment"):
        Segment.create(4096, tmp_path / "missing")
