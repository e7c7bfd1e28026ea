"""A slide's identity: the content decides, wherever the slide lies; several files are one slide."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from harness.slide_formats import write_dicom
from harness.slides import GeneratedSlide, SlideSpec
from histoserve.errors import SlideError
from histoserve.slides.identity import (
    DIGEST_METHOD,
    WHOLE_BELOW_BYTES,
    SlideIdentity,
    check_unchanged,
    identity_change,
    sample_ranges,
    sampled_sha256,
    slide_identity,
)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_a_moved_or_copied_slide_is_the_same_slide(
    svs_slide: GeneratedSlide, tmp_path: Path
) -> None:
    before = slide_identity(svs_slide.path)
    assert before.path == str(svs_slide.path.resolve()) and before.files == 1
    assert before.size == svs_slide.path.stat().st_size and before.method == DIGEST_METHOD
    moved = tmp_path / "new-mount" / "renamed.svs"
    moved.parent.mkdir()
    shutil.copyfile(svs_slide.path, moved)  # another path, another mtime, the same bytes
    os.utime(moved, ns=(1, 1))
    after = slide_identity(moved)
    assert after.path != before.path and after.mtime_ns != before.mtime_ns
    assert after.digest == before.digest
    assert identity_change(before, after) == ""


def test_other_content_is_another_slide(
    svs_slide: GeneratedSlide, tiff_slide: GeneratedSlide, tmp_path: Path
) -> None:
    before = slide_identity(svs_slide.path)
    other = identity_change(before, slide_identity(tiff_slide.path))
    assert other.startswith("slide changed since the done file (path ")
    assert f"size {before.size:,} -> " in other
    same_size = tmp_path / "edited.svs"
    shutil.copyfile(svs_slide.path, same_size)
    _flip(same_size, 200)  # in the first MiB: always sampled
    change = identity_change(before, slide_identity(same_size))
    assert f"same size ({before.size:,} bytes), other content" in change


def test_small_files_are_digested_whole_and_large_ones_sampled(tmp_path: Path) -> None:
    small = tmp_path / "small.bin"
    small.write_bytes(bytes(WHOLE_BELOW_BYTES))
    digest = sampled_sha256(small)
    _flip(small, WHOLE_BELOW_BYTES // 2 + 12345)
    assert sampled_sha256(small) != digest  # any byte of a small file counts
    large = tmp_path / "large.bin"
    with open(large, "wb") as fh:
        fh.truncate(64 << 20)  # sparse: 64 MiB, no disk
    ranges = sample_ranges(64 << 20)
    assert ranges[0] == (0, 1 << 20) and ranges[-1] == ((63 << 20), 1 << 20)
    assert sum(length for _, length in ranges) == 4 << 20  # 2 MiB + 32 x 64 KiB
    for offset, length in (ranges[0], ranges[5], ranges[-1]):
        digest = sampled_sha256(large)
        _flip(large, offset + length - 1)
        assert sampled_sha256(large) != digest


def test_a_dicom_slide_is_every_dicom_file_of_its_series(tmp_path: Path) -> None:
    folder = write_dicom(
        tmp_path / "case", SlideSpec(width=512, height=512, boxes=(), downsamples=(1, 2))
    )
    whole = slide_identity(folder)
    assert whole.files == 2 and whole.size == sum(p.stat().st_size for p in folder.iterdir())
    # One of its files names the same series: the same identity as the folder.
    assert slide_identity(folder / "level0.dcm").digest == whole.digest
    (folder / "README.txt").write_text("notes")  # not DICOM: OpenSlide does not read it
    assert identity_change(whole, slide_identity(folder)) == ""
    _flip(folder / "level1.dcm", 300)  # a lower level rewritten: another slide
    change = identity_change(whole, slide_identity(folder))
    assert "same size" in change and "other content" in change
    (folder / "level1.dcm").unlink()
    assert "2 -> 1 files" in identity_change(whole, slide_identity(folder))


def test_an_mrxs_slide_is_its_index_and_its_data_folder(tmp_path: Path) -> None:
    index = tmp_path / "case.mrxs"
    index.write_text("[GENERAL]\n")
    data = tmp_path / "case"
    data.mkdir()
    (data / "Slidedat.ini").write_text("[GENERAL]\nSLIDE_VERSION=1.0\n")
    (data / "Data0000.dat").write_bytes(b"\xff\xd8" * 1000)
    before = slide_identity(index)
    assert before.files == 3
    _flip(data / "Data0000.dat", 10)
    assert "other content" in identity_change(before, slide_identity(index))


def test_a_missing_slide_is_a_slide_error(tmp_path: Path) -> None:
    with pytest.raises(SlideError, match=r"slide file not found: .*absent\.svs"):
        slide_identity(tmp_path / "absent.svs")


def test_the_recorded_identity_round_trips_and_junk_or_none_is_never_trusted(
    svs_slide: GeneratedSlide,
) -> None:
    current = slide_identity(svs_slide.path)
    assert SlideIdentity.from_attr(current.to_attr()) == current
    assert SlideIdentity.from_attr(current.to_attr().encode()) == current
    deep = "[" * 1000 + "]" * 1000  # a RecursionError before: the slide failed, not re-embedded
    for junk in (None, "", "{", "[]", '{"path": "x"}', 3, deep, deep.encode()):
        assert SlideIdentity.from_attr(junk) is None
    assert "records no slide identity" in identity_change(None, current)
    older = SlideIdentity(current.path, current.size, current.mtime_ns, current.digest, 1, "md5")
    assert "digest is md5" in identity_change(older, current)


def test_another_series_added_to_a_dicom_folder_leaves_a_slide_as_it_was(tmp_path: Path) -> None:
    """A scanner's export folder: slide B's files beside slide A's are not A's (its series)."""
    spec = SlideSpec(width=512, height=512, boxes=(), downsamples=(1, 2))
    folder = write_dicom(tmp_path / "scanner", spec)
    for level in ("level0", "level1"):
        (folder / f"{level}.dcm").rename(folder / f"A_{level}.dcm")
    alone = slide_identity(folder / "A_level0.dcm")
    other = write_dicom(tmp_path / "b", SlideSpec(width=256, height=256, boxes=()))
    b_files = sorted(other.iterdir())
    for path in b_files:
        path.rename(folder / f"B_{path.name}")
    os.mkfifo(folder / "B_fifo.dcm")  # a FIFO is no slide file: skipped, never opened blocking
    after = slide_identity(folder / "A_level0.dcm")
    assert after.files == 2 and identity_change(alone, after) == ""
    assert slide_identity(folder / "B_level0.dcm").files == len(b_files)
    assert slide_identity(folder).digest == after.digest  # the folder: OpenSlide's pick, A_level0


def test_an_mrxs_slide_is_the_files_its_slidedat_names(tmp_path: Path) -> None:
    index = tmp_path / "case.mrxs"
    index.write_text("[GENERAL]\n")
    data = tmp_path / "case"
    data.mkdir()
    slidedat = "[HIERARCHICAL]\nINDEXFILE=Index.dat\n[DATAFILE]\nFILE_COUNT=2\n"
    (data / "Slidedat.ini").write_text(slidedat + "FILE_0=Data0000.dat\nFILE_1=Data0001.dat\n")
    for name in ("Index.dat", "Data0000.dat", "Data0001.dat"):
        (data / name).write_bytes(name.encode() * 100)
    before = slide_identity(index)
    assert before.files == 5
    (data / ".DS_Store").write_bytes(b"Finder")  # what a Mac adds when the folder is opened
    (data / "._Data0000.dat").write_bytes(b"AppleDouble")
    (data / "notes.txt").write_text("a user's note")
    assert identity_change(before, slide_identity(index)) == ""
    _flip(data / "Data0001.dat", 5)
    assert "other content" in identity_change(before, slide_identity(index))


def test_without_a_readable_slidedat_every_visible_file_counts(tmp_path: Path) -> None:
    index = tmp_path / "case.mrxs"
    index.write_text("[GENERAL]\n")
    (tmp_path / "case").mkdir()
    (tmp_path / "case" / "Data0000.dat").write_bytes(b"\xff\xd8" * 1000)
    before = slide_identity(index)
    for hidden in (".DS_Store", "._Data0000.dat", "Thumbs.db"):
        (tmp_path / "case" / hidden).write_bytes(b"x")
    assert identity_change(before, slide_identity(index)) == ""
    (tmp_path / "case" / "Data0001.dat").write_bytes(b"more")
    assert "2 -> 3 files" in identity_change(before, slide_identity(index))


def test_a_fifo_or_a_nul_is_a_slide_error_not_a_hang_or_a_traceback(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "a.svs")
    with pytest.raises(SlideError, match=r"cannot read slide .*a\.svs: .*is a FIFO"):
        slide_identity(tmp_path / "a.svs")
    with pytest.raises(SlideError, match=r"slide path 'a\\x00b.svs' is no usable path"):
        slide_identity(Path("a\0b.svs"))


def test_a_slide_changed_since_its_identity_was_taken_fails_the_check(
    svs_slide: GeneratedSlide, tmp_path: Path
) -> None:
    copy = tmp_path / "copy.svs"
    shutil.copyfile(svs_slide.path, copy)
    identity = slide_identity(copy)
    check_unchanged(copy, identity)  # unchanged: nothing raised
    with open(copy, "ab") as handle:
        handle.write(b"\0" * 10)  # a copy still running
    with pytest.raises(SlideError, match=r"changed while it was embedded \(size .*no done file"):
        check_unchanged(copy, identity)
