"""Atomic writes (HDF5, QC files, report): temp names no other pod picks, no symlink followed,
no folder inside ``--out`` written through a symlink, no FIFO opened blocking."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from harness.slides import GeneratedSlide
from histoserve.atomic import (
    NotRegularFile,
    UnsafeFolder,
    atomic_path,
    check_folders,
    open_regular,
    read_regular,
    remove_file,
    remove_stale_temps,
    temp_path,
)
from histoserve.results.status import StatusLog
from histoserve.review.qc import write_slide_qc
from histoserve.review.report import write_report
from histoserve.slides.grid import plan_tiles
from histoserve.slides.readers import SlideReader, resolve_mpp
from histoserve.tissue.masks import find_tissue

VICTIM_TEXT = "a user's file, outside --out\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    return victim


def _qc(slide: GeneratedSlide, out: Path, slide_id: str) -> None:
    with SlideReader.open(slide.path) as reader:
        mpp = resolve_mpp(reader, None, None, 0.05)
        plan = plan_tiles(reader, mpp, 0.5, 224, 0.05)
        tissue = find_tissue(reader, mpp, plan, "otsu")
    kept = plan.coords[tissue.fractions >= 0.25]
    write_slide_qc(out, slide_id, (tissue.thumb, tissue.thumb_mpp), plan, tissue, kept)


def test_temp_names_carry_a_full_uuid4_not_the_pid(tmp_path: Path) -> None:
    names = {temp_path(tmp_path / "S1.h5").name for _ in range(1000)}
    assert len(names) == 1000
    for name in names:
        head, tag, tail = name.rsplit(".", 2)
        assert (head, tail) == (".S1.h5", "tmp") and uuid.UUID(hex=tag).version == 4


def test_a_long_name_still_fits_the_file_name_limit(tmp_path: Path) -> None:
    final = tmp_path / ("é" * 124 + ".h5")  # 251 bytes of UTF-8: the final name fits
    assert len(os.fsencode(temp_path(final).name)) <= 255
    with atomic_path(final) as tmp:
        tmp.write_text("whole")
    assert final.read_text() == "whole"


def test_a_symlink_at_the_final_name_is_replaced_not_followed(tmp_path: Path) -> None:
    victim, final = _victim(tmp_path), tmp_path / "out" / "S1.h5"
    final.parent.mkdir()
    final.symlink_to(victim)
    with atomic_path(final) as tmp:
        tmp.write_text("features")
    assert not final.is_symlink() and final.read_text() == "features"
    assert victim.read_text() == VICTIM_TEXT


def test_a_temp_file_swapped_for_a_symlink_is_never_renamed_into_place(tmp_path: Path) -> None:
    victim, final = _victim(tmp_path), tmp_path / "S1.h5"
    with pytest.raises(OSError), atomic_path(final) as tmp:  # ELOOP, or ours
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(victim)
    assert not final.exists() and not final.is_symlink()
    assert victim.read_text() == VICTIM_TEXT and not tmp.is_symlink()


def test_qc_files_and_the_report_leave_another_pods_temp_files_alone(
    svs_slide: GeneratedSlide, tmp_path: Path
) -> None:
    """Pods of a Job are all PID 1: a temp name of the PID is another pod's temp name too."""
    (tmp_path / "qc").mkdir()
    theirs = [
        tmp_path / "qc" / f".S1.{ext}.{os.getpid()}.tmp" for ext in ("jpg", "geojson", "json")
    ]
    theirs.append(tmp_path / f".report.html.{os.getpid()}.tmp")
    for path in theirs:
        path.write_text("another pod, half-way through")
    _qc(svs_slide, tmp_path, "S1")
    StatusLog(tmp_path).append("S1", "/d/S1.svs", "done", 8, 1.0)
    write_report(tmp_path)
    assert [p.read_text() for p in theirs] == ["another pod, half-way through"] * 4
    assert (tmp_path / "qc" / "S1.json").is_file() and (tmp_path / "report.html").is_file()


def test_qc_files_and_the_report_replace_symlinks_planted_at_their_names(
    svs_slide: GeneratedSlide, tmp_path: Path
) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    (out / "qc").mkdir(parents=True)
    planted = [out / "qc" / f"S1.{ext}" for ext in ("jpg", "geojson", "json")]
    planted.append(out / "report.html")
    for path in planted:
        path.symlink_to(victim)
    _qc(svs_slide, out, "S1")
    write_report(out)
    assert victim.read_text() == VICTIM_TEXT
    assert not any(p.is_symlink() for p in planted) and all(p.stat().st_size > 0 for p in planted)
    assert sorted(p.name for p in (out / "qc").iterdir()) == ["S1.geojson", "S1.jpg", "S1.json"]


def test_a_killed_runs_temp_is_removed_and_no_other_slides(tmp_path: Path) -> None:
    """Only ``.<name>.<uuid4 hex>.tmp`` of this very file goes; another slide's temp stays."""
    final = tmp_path / "S1.h5"
    stale = temp_path(final)
    stale.write_bytes(b"half a file")
    long_final = tmp_path / ("L" * 240 + ".h5")  # its temp name is cut to fit 255 bytes
    long_stale = temp_path(long_final)
    long_stale.write_bytes(b"x")
    others = [
        temp_path(tmp_path / "S1.h5.x.h5"),  # slide "S1.h5.x": same prefix, not ours
        tmp_path / ".S1.h5.notahex.tmp",
        tmp_path / "S1.h5",
    ]
    for other in others:
        other.write_bytes(b"keep")
    (tmp_path / f".S1.h5.{uuid.uuid4().hex}.tmp").symlink_to(tmp_path / "S1.h5")
    assert remove_stale_temps(final) == 1 and remove_stale_temps(long_final) == 1
    assert not stale.exists() and not long_stale.exists()
    assert all(other.read_bytes() == b"keep" for other in others)
    assert remove_stale_temps(tmp_path / "absent" / "S1.h5") == 0


def test_long_names_sharing_their_start_get_their_own_temp_prefixes(tmp_path: Path) -> None:
    """A cut temp name ends in a hash of the full name: A's clean-up never takes B's live temp."""
    common = "S" * 230
    final_a, final_b = tmp_path / f"{common}_A.h5", tmp_path / f"{common}_B.h5"
    live_b = temp_path(final_b)
    live_b.write_bytes(b"B, being written by another slide's thread")
    stale_a = temp_path(final_a)
    stale_a.write_bytes(b"A, left by a killed run")
    assert len(os.fsencode(live_b.name)) <= 255 and len(os.fsencode(stale_a.name)) <= 255
    assert remove_stale_temps(final_a) == 1
    assert not stale_a.exists() and live_b.read_bytes().startswith(b"B, being written")
    assert remove_stale_temps(final_b) == 1 and not live_b.exists()


def test_a_symlinked_folder_below_the_root_is_refused_the_root_itself_followed(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "S1.pt").write_text(VICTIM_TEXT)
    disk = tmp_path / "disk"
    disk.mkdir()
    out = tmp_path / "out"
    out.symlink_to(disk)  # --out itself a symlink: users do that on purpose
    (out / "pt_files").symlink_to(elsewhere)
    pt_file = out / "pt_files" / "S1.pt"
    with (
        pytest.raises(UnsafeFolder, match=r"out/pt_files is a symbolic link"),
        atomic_path(pt_file, root=out) as tmp,
    ):
        tmp.write_text("features")
    with pytest.raises(UnsafeFolder, match=r"out/pt_files is a symbolic link"):
        remove_file(out / "pt_files" / "S1.pt", root=out)
    with pytest.raises(UnsafeFolder):
        remove_stale_temps(out / "pt_files" / "S1.pt", root=out)
    with pytest.raises(UnsafeFolder):
        check_folders(out, [out / "pt_files"])
    assert [p.name for p in elsewhere.iterdir()] == ["S1.pt"]
    assert (elsewhere / "S1.pt").read_text() == VICTIM_TEXT
    with atomic_path(out / "h5_files" / "S1.h5", root=out) as tmp:  # made as a real folder
        tmp.write_text("features")
    assert (disk / "h5_files" / "S1.h5").read_text() == "features"
    assert not (disk / "h5_files").is_symlink()


def test_a_folder_swapped_for_a_symlink_while_written_renames_nothing(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    swapped = pytest.raises(UnsafeFolder, match="was replaced while a file was written")
    with swapped, atomic_path(out / "qc" / "S1.json", root=out) as tmp:
        (out / "qc").rename(tmp_path / "moved")
        (out / "qc").symlink_to(elsewhere)
        tmp.write_text("facts")  # by path: into the folder the symlink names
    assert not (tmp_path / "moved" / "S1.json").exists()
    assert not list((tmp_path / "moved").iterdir())  # our temp removed, nothing renamed
    assert not (elsewhere / "S1.json").exists()


def test_a_fifo_is_refused_at_once_never_opened_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "a.h5")
    with pytest.raises(NotRegularFile, match=r"a\.h5 is a FIFO, not a regular file"):
        open_regular(tmp_path / "a.h5")
    with pytest.raises(NotRegularFile):
        read_regular(tmp_path / "a.h5", 1024)
    (tmp_path / "link").symlink_to(tmp_path / "a.h5")
    with pytest.raises(NotRegularFile, match="is a symbolic link"):
        open_regular(tmp_path / "link")
    with pytest.raises(NotRegularFile, match="is a FIFO"):
        open_regular(tmp_path / "link", follow_symlinks=True)
    (tmp_path / "big.json").write_bytes(b"x" * 2048)
    with pytest.raises(OSError, match="over 1,024 bytes"):
        read_regular(tmp_path / "big.json", 1024)


def test_a_dead_runs_temp_files_are_swept_and_a_live_ones_are_not(tmp_path: Path) -> None:
    """A killed writer's temp goes; a writer still inside atomic_path keeps its temp."""
    import subprocess
    import sys

    from histoserve.atomic import SWEEP_MIN_AGE_S, sweep_dead_temps

    qc = tmp_path / "qc"
    qc.mkdir()
    killed = subprocess.run(  # a writer killed mid-write: its temp stays behind, unlocked
        [sys.executable, "-c",
         "import os, sys; from pathlib import Path; from histoserve.atomic import atomic_path\n"
         f"with atomic_path(Path({str(qc / 'a.jpg')!r})) as tmp:\n"
         "    tmp.write_bytes(b'half'); os._exit(9)"],
        check=False,
    )  # fmt: skip
    assert killed.returncode == 9
    later = time.time() + SWEEP_MIN_AGE_S + 1
    with atomic_path(qc / "b.jpg") as live:  # this process is alive and writing
        live.write_bytes(b"whole soon")
        temps = sorted(p.name for p in qc.iterdir())
        assert len(temps) == 2 and all(t.endswith(".tmp") for t in temps)
        assert sweep_dead_temps(qc, root=tmp_path, now_s=time.time()) == 0  # too young
        assert sweep_dead_temps(qc, root=tmp_path, now_s=later) == 1
        assert live.exists()
    assert sorted(p.name for p in qc.iterdir()) == ["b.jpg"]
    (qc / "c.jpg").write_bytes(b"not a temp")
    (qc / ".x.0123.tmp").write_bytes(b"not our name")
    assert sweep_dead_temps(qc, root=tmp_path, now_s=later) == 0
    assert sweep_dead_temps(tmp_path / "missing", root=tmp_path) == 0
