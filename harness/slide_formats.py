"""The same generated slides as :mod:`harness.slides`, written as Zeiss CZI and DICOM WSI.

Pixels come from :func:`harness.slides.render_region` for a
:class:`~harness.slides.SlideSpec`, so a CZI or DICOM slide and a lossless
(deflate) TIFF of the same spec hold the same pixels, and a test can check
that they embed to the same numbers.

- :func:`write_czi`: ``pylibCZIrw``'s writer, level 0 only, in 1024 px
  subblocks (zstd or uncompressed; pylibCZIrw writes no JPEG-XR), ``Bgr24``
  as ZEN writes brightfield, scaling in metres per pixel.
  :func:`write_czi_jpegxr` then re-encodes every subblock as JPEG-XR
  (``imagecodecs``), the compression Zeiss scanners use.
- :func:`write_dicom`: a DICOM WSI series by hand with ``pydicom`` (VL Whole
  Slide Microscopy Image, ``TILED_FULL``, native RGB frames), one instance per
  level of ``spec.downsamples``, Pixel Spacing from ``spec.mpp``.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from harness.slides import SlideSpec, render_region

_CZI_BLOCK = 1024
_CZI_JPEGXR = 4  # libCZI's CompressionMode::JpgXr
# GUID_PKPixelFormat24bppRGB / 24bppBGR as stored (little-endian fields).
_GUID_24BPP_RGB = bytes.fromhex("24c3dd6f034efe4bb1853d77768dc90d")
_GUID_24BPP_BGR = bytes.fromhex("24c3dd6f034efe4bb1853d77768dc90c")
_WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"


def write_czi(path: Path, spec: SlideSpec, compression: str = "zstd1:") -> Path:
    """``spec``'s level 0 as a CZI at ``path`` (``compression``: a pylibCZIrw option string)."""
    from pylibCZIrw import czi

    assert spec.mpp is not None, "a CZI test slide needs an mpp"
    with czi.create_czi(str(path), exist_ok=True, compression_options=compression) as writer:
        for y in range(0, spec.height, _CZI_BLOCK):
            for x in range(0, spec.width, _CZI_BLOCK):
                w, h = min(_CZI_BLOCK, spec.width - x), min(_CZI_BLOCK, spec.height - y)
                rgb = render_region(spec, x, y, w, h)
                writer.write(
                    np.ascontiguousarray(rgb[:, :, ::-1]),
                    location=(x, y),
                    plane={"C": 0, "T": 0, "Z": 0},
                )
        writer.write_metadata(
            "histoserve test", scale_x=spec.mpp[0] * 1e-6, scale_y=spec.mpp[1] * 1e-6
        )
    return Path(path)


def write_czi_jpegxr(src: Path, dst: Path, quality: float = 0.95) -> Path:
    """A copy of an uncompressed CZI (``write_czi(..., "uncompressed:")``) with JPEG-XR subblocks.

    Walks the ZISRAW segments, encodes every subblock's ``Bgr24`` pixels with
    ``imagecodecs.jpegxr_encode``, marks it ``Compression = 4`` (JpgXr), lays
    the segments out again (32-byte aligned) and points the file header and
    the subblock directory at the new positions.
    """
    data, out, moved = Path(src).read_bytes(), bytearray(), {}
    pos = 0
    while pos < len(data):
        kind = data[pos : pos + 16].rstrip(b"\0")
        (allocated,) = struct.unpack_from("<q", data, pos + 16)
        segment = data[pos + 32 : pos + 32 + allocated]
        moved[pos] = len(out)
        if kind == b"ZISRAWSUBBLOCK":
            segment = _jpegxr_subblock(segment, len(out), quality)
        out += _segment(
            data[pos : pos + 16], segment, allocated if kind != b"ZISRAWSUBBLOCK" else 0
        )
        pos += 32 + allocated
    _repoint(out, moved)
    Path(dst).write_bytes(bytes(out))
    return Path(dst)


def _segment(head: bytes, body: bytes, allocated: int) -> bytes:
    used = len(body)
    size = allocated if used <= allocated else -(-used // 32) * 32
    return head + struct.pack("<qq", size, used) + body + b"\0" * (size - used)


def _jpegxr_subblock(body: bytes, new_pos: int, quality: float) -> bytes:
    import imagecodecs

    meta_size, att_size, data_size = struct.unpack_from("<iiq", body, 0)
    (dims,) = struct.unpack_from("<i", body, 16 + 28)
    entry_end = 16 + 32 + 20 * dims
    sizes = {}
    for i in range(dims):
        name, _, _, _, stored = struct.unpack_from("<4siifi", body, 16 + 32 + 20 * i)
        sizes[name.rstrip(b"\0")] = stored
    start = max(256, entry_end) + meta_size
    raw = np.frombuffer(body[start : start + data_size], np.uint8)
    pixels = raw.reshape(sizes[b"Y"], sizes[b"X"], 3)
    # libCZI decodes Bgr24 subblocks only from 24bppBGR JPEG-XR; imagecodecs writes
    # 24bppRGB. The coded planes are the same (R first) and the GUIDs differ in one
    # byte: encode the pixels as RGB, then label them BGR.
    encoded = imagecodecs.jpegxr_encode(np.ascontiguousarray(pixels[:, :, ::-1]), level=quality)
    assert encoded.count(_GUID_24BPP_RGB) == 1, "unexpected JPEG-XR container"
    encoded = encoded.replace(_GUID_24BPP_RGB, _GUID_24BPP_BGR)
    head = bytearray(body[: max(256, entry_end)])
    struct.pack_into("<q", head, 8, len(encoded))
    struct.pack_into("<q", head, 16 + 6, new_pos)
    struct.pack_into("<i", head, 16 + 18, _CZI_JPEGXR)
    tail = body[start + data_size : start + data_size + att_size]
    return bytes(head) + body[max(256, entry_end) : start] + encoded + tail


def _repoint(out: bytearray, moved: dict[int, int]) -> None:
    """New positions in the file header; new positions and compression in the directory."""
    for offset in (32 + 52, 32 + 60, 32 + 72):  # directory, metadata, attachment directory
        (old,) = struct.unpack_from("<q", out, offset)
        if old:
            struct.pack_into("<q", out, offset, moved[old])
    pos = 0
    while pos < len(out):
        (allocated,) = struct.unpack_from("<q", out, pos + 16)
        if out[pos : pos + 16].rstrip(b"\0") == b"ZISRAWDIRECTORY":
            (count,) = struct.unpack_from("<i", out, pos + 32)
            entry = pos + 32 + 128
            for _ in range(count):
                (old,) = struct.unpack_from("<q", out, entry + 6)
                struct.pack_into("<q", out, entry + 6, moved[old])
                struct.pack_into("<i", out, entry + 18, _CZI_JPEGXR)  # as its subblock says
                (dims,) = struct.unpack_from("<i", out, entry + 28)
                entry += 32 + 20 * dims
        pos += 32 + allocated


def write_dicom(folder: Path, spec: SlideSpec) -> Path:
    """``spec`` as a DICOM WSI series in ``folder`` (one ``level<i>.dcm`` per downsample)."""
    from pydicom.uid import generate_uid

    assert spec.mpp is not None, "a DICOM test slide needs an mpp"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    uids = {"study": generate_uid(), "series": generate_uid(), "frame": generate_uid()}
    for index, d in enumerate(spec.downsamples):
        _write_level(folder / f"level{index}.dcm", spec, index, d, uids)
    return folder


def _frames(spec: SlideSpec, d: int) -> tuple[bytes, int]:
    t = spec.tile
    w, h = spec.width // d, spec.height // d
    frames = []
    for y in range(0, h, t):
        for x in range(0, w, t):
            tile = np.full((t, t, 3), 255, np.uint8)
            part = render_region(spec, x, y, min(t, w - x), min(t, h - y), d)
            tile[: part.shape[0], : part.shape[1]] = part
            frames.append(tile.tobytes())
    return b"".join(frames), len(frames)


def _write_level(path: Path, spec: SlideSpec, index: int, d: int, uids: dict[str, str]) -> None:
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = _WSI_SOP_CLASS
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = generate_uid()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.StudyInstanceUID, ds.SeriesInstanceUID = uids["study"], uids["series"]
    ds.FrameOfReferenceUID = uids["frame"]
    ds.Modality, ds.PatientName, ds.PatientID, ds.StudyID = "SM", "Test", "1", "1"
    ds.SeriesNumber, ds.InstanceNumber, ds.ContainerIdentifier = 1, index + 1, "1"
    ds.ImageType = (
        ["ORIGINAL", "PRIMARY", "VOLUME", "NONE"] if index == 0
        else ["DERIVED", "PRIMARY", "VOLUME", "RESAMPLED"]
    )  # fmt: skip
    _geometry(ds, spec, d)
    measures = Dataset()
    measures.PixelSpacing = [spec.mpp[1] * d / 1000, spec.mpp[0] * d / 1000]  # type: ignore[index]
    measures.SliceThickness = 0.001
    frame_type = Dataset()
    frame_type.FrameType = ds.ImageType
    shared = Dataset()
    shared.PixelMeasuresSequence, shared.WholeSlideMicroscopyImageFrameTypeSequence = (
        [measures],
        [frame_type],
    )
    ds.SharedFunctionalGroupsSequence = [shared]
    origin = Dataset()
    origin.XOffsetInSlideCoordinateSystem = origin.YOffsetInSlideCoordinateSystem = 0
    ds.TotalPixelMatrixOriginSequence = [origin]
    ds.ImageOrientationSlide = [0, -1, 0, -1, 0, 0]
    ds.OpticalPathSequence = [_optical_path()]
    ds.PixelData, ds.NumberOfFrames = _frames(spec, d)
    ds.save_as(path, enforce_file_format=True)


def _geometry(ds: Any, spec: SlideSpec, d: int) -> None:
    """Tile and matrix sizes, pixel format, TILED_FULL, imaged volume (mm)."""
    ds.Rows = ds.Columns = spec.tile
    ds.TotalPixelMatrixColumns, ds.TotalPixelMatrixRows = spec.width // d, spec.height // d
    ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.PlanarConfiguration = 3, "RGB", 0
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.DimensionOrganizationType, ds.TotalPixelMatrixFocalPlanes = "TILED_FULL", 1
    ds.NumberOfOpticalPaths = 1
    ds.ImagedVolumeWidth = spec.width * spec.mpp[0] / 1000  # type: ignore[index]
    ds.ImagedVolumeHeight = spec.height * spec.mpp[1] / 1000  # type: ignore[index]
    ds.ImagedVolumeDepth = 0.001


def _optical_path() -> object:
    from pydicom.dataset import Dataset

    def code(value: str, scheme: str, meaning: str) -> Dataset:
        item = Dataset()
        item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = value, scheme, meaning
        return item

    path = Dataset()
    path.OpticalPathIdentifier = "1"
    path.IlluminationTypeCodeSequence = [code("111744", "DCM", "Brightfield illumination")]
    path.IlluminationColorCodeSequence = [code("414298005", "SCT", "Full Spectrum")]
    return path
