"""The Series Instance UID read from a DICOM file's header, as pydicom (the reference) reads it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from predictor.client.embed.dicom_header import MAX_HEADER_BYTES, DicomFile, read_series

pydicom = pytest.importorskip("pydicom")  # a test dependency: the client reads DICOM without it


def _write(path: Path, syntax: str, *, undefined: bool, private_bytes: int = 0) -> str:
    """A DICOM file whose series UID comes after nested sequences (and a large private value)."""
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
    ds.save_as(path, enforce_file_format=True)
    assert pydicom.dcmread(path).SeriesInstanceUID == ds.SeriesInstanceUID
    return ds.SeriesInstanceUID


def _read(path: Path) -> DicomFile | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_series(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "syntax", ["1.2.840.10008.1.2.1", "1.2.840.10008.1.2", "1.2.840.10008.1.2.4.50"]
)
@pytest.mark.parametrize("undefined", [True, False])
def test_the_series_uid_after_nested_sequences(
    tmp_path: Path, syntax: str, undefined: bool
) -> None:
    uid = _write(tmp_path / "a.dcm", syntax, undefined=undefined)
    assert _read(tmp_path / "a.dcm") == DicomFile(uid)


def test_a_large_value_before_the_uid_is_read_past_and_a_larger_one_is_unknown(
    tmp_path: Path,
) -> None:
    uid = _write(tmp_path / "a.dcm", "1.2.840.10008.1.2.1", undefined=True, private_bytes=200_000)
    assert _read(tmp_path / "a.dcm") == DicomFile(uid)
    _write(
        tmp_path / "b.dcm", "1.2.840.10008.1.2.1", undefined=True, private_bytes=MAX_HEADER_BYTES
    )
    assert _read(tmp_path / "b.dcm") == DicomFile(None)


def test_no_dicom_or_a_broken_header(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not DICOM")
    assert _read(tmp_path / "notes.txt") is None
    uid = _write(tmp_path / "a.dcm", "1.2.840.10008.1.2.1", undefined=True)
    data = (tmp_path / "a.dcm").read_bytes()
    cut = data.index(uid.encode()) - 20
    (tmp_path / "cut.dcm").write_bytes(data[:cut])  # cut short before the UID
    assert _read(tmp_path / "cut.dcm") == DicomFile(None)
    (tmp_path / "junk.dcm").write_bytes(data[:132] + os.urandom(4096))
    assert _read(tmp_path / "junk.dcm") == DicomFile(None)
