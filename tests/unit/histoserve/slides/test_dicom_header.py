"""A DICOM file's Series Instance UID as the slide identity reads it (pydicom writes the files)."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from harness.slide_formats import write_dicom
from harness.slides import SlideSpec
from histoserve.atomic import NotRegularFile, open_regular
from histoserve.slides.dicom_header import MAX_HEADER_BYTES, DicomFile, read_series

pydicom = pytest.importorskip("pydicom")

EXPLICIT, IMPLICIT, JPEG = "1.2.840.10008.1.2.1", "1.2.840.10008.1.2", "1.2.840.10008.1.2.4.50"
DEFLATED = "1.2.840.10008.1.2.1.99"


def _dataset(syntax: str, *, undefined: bool, private_bytes: int = 0):
    """A data set whose series UID comes after nested sequences (and a large private value)."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.sequence import Sequence
    from pydicom.uid import generate_uid

    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.77.1.6"
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = generate_uid()
    ds.file_meta.TransferSyntaxUID = syntax
    inner = Dataset()
    inner.CodeValue, inner.CodingSchemeDesignator, inner.CodeMeaning = "1", "DCM", "x"
    item = Dataset()
    item.SeriesInstanceUID = generate_uid()  # another series, nested: never taken for the file's
    item.PurposeOfReferenceCodeSequence = Sequence([inner])
    ds.ReferencedSeriesSequence = Sequence([item, item])  # (0008,1115): before (0020,000E)
    ds.Modality = "SM"
    if private_bytes:
        ds.add_new(0x00091010, "OB", b"\0" * private_bytes)
    ds.SeriesInstanceUID = generate_uid()
    ds.StudyInstanceUID = generate_uid()
    for element in (ds["ReferencedSeriesSequence"], item["PurposeOfReferenceCodeSequence"]):
        element.is_undefined_length = undefined
    for nested in (item, inner):
        nested.is_undefined_length_sequence_item = undefined
    return ds


def _write(path: Path, syntax: str = EXPLICIT, *, undefined: bool = True, **kw: int) -> str:
    ds = _dataset(syntax, undefined=undefined, **kw)
    ds.save_as(path, enforce_file_format=True)
    assert pydicom.dcmread(path).SeriesInstanceUID == ds.SeriesInstanceUID
    return ds.SeriesInstanceUID


def _read(path: Path) -> DicomFile | None:
    """``path`` read as identity.py reads it: opened never blocking, regular files only."""
    with open(open_regular(path, follow_symlinks=True), "rb") as handle:
        return read_series(handle)


def test_each_file_of_a_written_dicom_slide_is_in_its_series(tmp_path: Path) -> None:
    folder = write_dicom(tmp_path / "case", SlideSpec(width=512, height=512, boxes=()))
    files = sorted(folder.glob("*.dcm"))
    assert len(files) == 3
    (uid,) = {pydicom.dcmread(f).SeriesInstanceUID for f in files}
    assert [_read(f) for f in files] == [DicomFile(uid)] * 3


@pytest.mark.parametrize("syntax", [EXPLICIT, IMPLICIT, JPEG])
@pytest.mark.parametrize("undefined", [True, False])
def test_the_series_uid_after_nested_sequences(
    tmp_path: Path, syntax: str, undefined: bool
) -> None:
    uid = _write(tmp_path / "a.dcm", syntax, undefined=undefined)
    assert _read(tmp_path / "a.dcm") == DicomFile(uid)


def test_a_large_value_before_the_uid_is_read_past_and_a_larger_one_is_unknown(
    tmp_path: Path,
) -> None:
    uid = _write(tmp_path / "a.dcm", private_bytes=200_000)
    assert _read(tmp_path / "a.dcm") == DicomFile(uid)
    _write(tmp_path / "b.dcm", private_bytes=MAX_HEADER_BYTES)
    assert _read(tmp_path / "b.dcm") == DicomFile(None)


def test_a_truncated_file_has_an_unknown_series(tmp_path: Path) -> None:
    uid = _write(tmp_path / "a.dcm")
    data = (tmp_path / "a.dcm").read_bytes()
    at = data.index(uid.encode())
    for cut in (at - 20, at + len(uid) // 2):  # before the UID, and through it
        (tmp_path / "cut.dcm").write_bytes(data[:cut])
        assert _read(tmp_path / "cut.dcm") == DicomFile(None), cut


def test_junk_after_the_dicom_magic_has_an_unknown_series(tmp_path: Path) -> None:
    _write(tmp_path / "a.dcm")
    data = (tmp_path / "a.dcm").read_bytes()
    (tmp_path / "junk.dcm").write_bytes(data[:132] + os.urandom(4096))
    assert _read(tmp_path / "junk.dcm") == DicomFile(None)
    (tmp_path / "meta.dcm").write_bytes(data[:132] + b"\x02\x00\x10\x00UI\xff\xff")
    assert _read(tmp_path / "meta.dcm") == DicomFile(None)


def test_a_deflated_data_set_is_never_inflated(tmp_path: Path) -> None:
    """pydicom would inflate it whole: a small file could be gigabytes (a deflate bomb)."""
    path = tmp_path / "deflated.dcm"
    ds = _dataset(DEFLATED, undefined=True)
    ds.save_as(path, enforce_file_format=True)
    assert pydicom.dcmread(path).SeriesInstanceUID == ds.SeriesInstanceUID
    assert len(zlib.compress(b"\0" * (64 << 20))) < 100_000  # what a bomb could hold
    assert _read(path) == DicomFile(None)


def test_no_part10_file_is_no_dicom(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not DICOM")
    assert _read(tmp_path / "notes.txt") is None
    (tmp_path / "empty.dcm").write_bytes(b"")
    assert _read(tmp_path / "empty.dcm") is None
    bare = _dataset(EXPLICIT, undefined=True)
    del bare.file_meta  # no preamble, no meta header: a bare data set, as libdicom refuses it
    bare.save_as(tmp_path / "bare.dcm", implicit_vr=False, little_endian=True)
    assert pydicom.dcmread(tmp_path / "bare.dcm", force=True).SeriesInstanceUID
    assert _read(tmp_path / "bare.dcm") is None


def test_a_fifo_never_blocks(tmp_path: Path) -> None:
    """Opened as identity.py opens files, a FIFO is refused; read anyway, it is no DICOM."""
    fifo = tmp_path / "a.dcm"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile):
        _read(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # no writer: a read returns at once
    with open(fd, "rb") as handle:
        assert read_series(handle) is None
