"""A slide's identity: which bytes a done file was made from, and whether they are still there.

Resume must never keep features made from another slide: a manifest corrected
to map ``PATIENT_042`` to another file, a slide re-scanned or re-exported under
its old name. So every done file records the identity of the slide it was made
from (:class:`SlideIdentity`, the ``slide_identity`` attribute), and a re-run
compares it with the slide the run names now (:func:`identity_change`): any
difference re-embeds the slide, with the difference in its status line. A
done file without an identity (an older histoserve's) is not trusted either:
its slide is embedded once more (its status line says so). Identity is
taken again once a slide is embedded, right before its done file is renamed
into place (:func:`check_unchanged`): a slide that changed meanwhile (a copy
still being written) fails, and gets no done file.

What counts is the content: the size in bytes and a SHA-256 over a fixed
sample of the bytes (the size, the first and the last MiB and 32 blocks of
64 KiB evenly spaced between them; a file of at most 8 MiB is digested whole).
A full SHA-256 would read every byte of every slide on every resume check
(4 to 7 s for a 4 GiB slide here, against 4 to 18 ms for the sample:
docs/performance.md, "Resume checks"). The resolved path and the mtime are recorded too and
said in the message, but neither counts alone: moving a cohort to another
mount, or copying it without keeping mtimes, must not re-embed every slide.
The limit: an edit in place that keeps the size and touches none of the
sampled bytes is not seen (``--force`` re-embeds).

A slide made of several files is all of them, and only them: a DICOM slide
(its folder, or one of its files) is the files of its folder that share the
Series Instance UID of the file OpenSlide is given (the named file, or the
one :func:`~histoserve.slides.readers_dicom.dicom_instance` picks), read
from their headers (:mod:`~histoserve.slides.dicom_header`), so another
slide's series added to a scanner's folder changes nothing; a file whose
series cannot be read counts for every slide of the folder, and so does
every file when the slide's own series cannot be read (then adding a slide
to the folder re-embeds the others once). An MRXS slide is its ``.mrxs`` and
the files of its data folder (``<stem>/``) that OpenSlide reads:
``Slidedat.ini`` and the index and data files it names (without a readable
``Slidedat.ini``: every file there but hidden ones, ``._*`` AppleDouble,
``.DS_Store``, ``Thumbs.db``, ``desktop.ini``). Their names, sizes and
sampled digests make its digest. Only regular files are read, never
blocking (a FIFO is no slide file).
"""

from __future__ import annotations

import configparser
import functools
import hashlib
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from histoserve import jsonsafe
from histoserve.atomic import open_regular, read_regular
from histoserve.errors import SlideError
from histoserve.slides.dicom_header import DicomFile, read_series

IDENTITY_ATTR = "slide_identity"
DIGEST_METHOD = "sha256-sample-v1"  # another method (a future one) never compares equal
WHOLE_BELOW_BYTES = 8 << 20
HEAD_BYTES = TAIL_BYTES = 1 << 20
BLOCK_BYTES, N_BLOCKS = 64 << 10, 32
SLIDEDAT_MAX_BYTES = 4 << 20
# The slide_identity attribute: a path, four numbers, a digest (a few hundred bytes).
_MAX_ATTR_BYTES = 64 << 10
_NOT_SLIDE_FILES = ("thumbs.db", "desktop.ini")  # and names starting with "."


@dataclass(frozen=True)
class SlideIdentity:
    """The slide a done file was made from.

    Attributes:
        path: Resolved path of the slide (file or folder), for people.
        size: Bytes, summed over its files.
        mtime_ns: Latest modification time of its files, for people.
        digest: Hex SHA-256 of the sample (:data:`DIGEST_METHOD`).
        files: How many files the slide is (DICOM, MRXS: more than one).
        method: How ``digest`` was made.
    """

    path: str
    size: int
    mtime_ns: int
    digest: str
    files: int = 1
    method: str = DIGEST_METHOD

    def to_attr(self) -> str:
        """JSON text for the done file's ``slide_identity`` attribute."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_attr(cls, value: Any) -> SlideIdentity | None:
        """The identity a done file records; None when it has none (an older histoserve) or junk."""
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        try:
            data = jsonsafe.loads(value, "slide_identity", max_bytes=_MAX_ATTR_BYTES)
            return cls(
                path=str(data["path"]),
                size=int(data["size"]),
                mtime_ns=int(data["mtime_ns"]),
                digest=str(data["digest"]),
                files=int(data.get("files", 1)),
                method=str(data.get("method", "")),
            )
        except (TypeError, ValueError, KeyError, AttributeError):
            return None


def slide_identity(path: Path) -> SlideIdentity:
    """The identity of the slide at ``path`` (a file, a DICOM folder or file, an MRXS).

    Raises:
        SlideError: The slide is missing or cannot be read.
    """
    path = Path(path)
    try:
        resolved = path.resolve()
        members = _members(resolved)
        digest = hashlib.sha256(DIGEST_METHOD.encode())
        size = mtime_ns = 0
        for name, member in members:
            member_size, member_mtime_ns, sample = _sampled(member)
            size, mtime_ns = size + member_size, max(mtime_ns, member_mtime_ns)
            digest.update(f"{name}\0{member_size}\0{sample}\n".encode())
    except FileNotFoundError as exc:
        raise SlideError(f"slide file not found: {path}") from exc
    except OSError as exc:
        raise SlideError(f"cannot read slide {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a NUL in a path given through the Python API
        raise SlideError(f"slide path {str(path)!r} is no usable path ({exc})") from exc
    return SlideIdentity(str(resolved), size, mtime_ns, digest.hexdigest(), len(members))


def check_unchanged(path: Path, identity: SlideIdentity) -> None:
    """SlideError when the slide at ``path`` is no longer ``identity``'s content.

    Called right before a slide's done file is renamed into place: a slide
    changed while it was embedded (a copy still running) gets no done file.
    """
    change = identity_difference(identity, slide_identity(path))
    if change:
        raise SlideError(
            f"the slide changed while it was embedded ({change}); no done file was written, "
            "so the next run embeds it again: re-run once the slide is no longer being written"
        )


def _members(resolved: Path) -> list[tuple[str, Path]]:
    """The files a slide is, each with its name inside the slide (``""`` for a lone file).

    Names are relative to the slide's folder, so renaming or moving a slide
    keeps its identity; a DICOM slide is its series' files, an MRXS its
    ``.mrxs`` and the files of its data folder OpenSlide reads.
    """
    if resolved.is_dir():
        return _dicom_series(resolved, None)
    if not resolved.exists():
        raise FileNotFoundError(resolved)
    if resolved.suffix.lower() == ".dcm" or _dicom_header(resolved) is not None:
        return _dicom_series(resolved.parent, resolved)
    data = resolved.with_suffix("")
    if resolved.suffix.lower() == ".mrxs" and data.is_dir():
        return [("", resolved), *_named(data, _mrxs_files(data))]
    return [("", resolved)]


def _dicom_series(folder: Path, named: Path | None) -> list[tuple[str, Path]]:
    """The DICOM files of ``folder`` in the series of ``named`` (or of OpenSlide's pick)."""
    found: dict[Path, str | None] = {}
    for path in folder.iterdir():
        if (header := _dicom_header(path)) is not None:
            found[path] = header.series_uid
    picked = sorted(found, key=lambda p: (p.suffix.lower() != ".dcm", p))  # dicom_instance's
    target = named or (picked[0] if picked else None)
    uid = found.get(target) if target is not None else None
    members = {p for p, u in found.items() if uid is None or u in (uid, None)}
    return _named(folder, members | ({named} if named else set()))


def _dicom_header(path: Path) -> DicomFile | None:
    """``path`` as DICOM (None: no regular DICOM file), read once per file version in a process."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return _read_dicom_header(str(path), key)


@functools.lru_cache(maxsize=8192)  # a folder of N slides: N identities read each header
def _read_dicom_header(path: str, key: tuple[int, ...]) -> DicomFile | None:
    try:
        with open(open_regular(Path(path), follow_symlinks=True), "rb") as handle:
            return read_series(handle)
    except OSError:
        return None


def _mrxs_files(data: Path) -> list[Path]:
    """The files of an MRXS data folder OpenSlide reads (see the module docstring)."""
    names = _slidedat_names(data / "Slidedat.ini")
    if names is not None:
        return [data / name for name in names]
    return [p for p in data.rglob("*") if not any(map(_not_slide, p.relative_to(data).parts))]


def _not_slide(name: str) -> bool:
    return name.startswith(".") or name.lower() in _NOT_SLIDE_FILES


def _slidedat_names(ini: Path) -> list[str] | None:
    """``Slidedat.ini`` and the index and data files it names; None when it names none."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        text = read_regular(ini, SLIDEDAT_MAX_BYTES).decode("utf-8-sig", "replace")
        parser.read_string(text)
        files = parser["DATAFILE"]
        names = [files[f"FILE_{i}"] for i in range(int(files["FILE_COUNT"]))]
        names += [ini.name, parser["HIERARCHICAL"]["INDEXFILE"]]
    except (OSError, KeyError, ValueError, configparser.Error):
        return None
    plain = all(n and n not in (".", "..") and "/" not in n and "\\" not in n for n in names)
    return names if plain else None


def _named(folder: Path, paths: Iterable[Path]) -> list[tuple[str, Path]]:
    return sorted((p.relative_to(folder).as_posix(), p) for p in paths if p.is_file())


def _sampled(path: Path) -> tuple[int, int, str]:
    """``(size, mtime_ns, sampled SHA-256)`` of the regular file at ``path`` (one descriptor)."""
    with open(open_regular(path, follow_symlinks=True), "rb", buffering=0) as fh:
        st = os.fstat(fh.fileno())
        return st.st_size, st.st_mtime_ns, _sample_digest(fh.fileno(), st.st_size)


def sampled_sha256(path: Path) -> str:
    """Hex SHA-256 of the file's size and its fixed sample (the whole file up to 8 MiB).

    Raises:
        OSError: The file cannot be read, or is no regular file (a FIFO is never opened blocking).
    """
    return _sampled(path)[2]


def _sample_digest(fd: int, size: int) -> str:
    digest = hashlib.sha256(size.to_bytes(8, "little"))
    ranges = [(0, size)] if size <= WHOLE_BELOW_BYTES else sample_ranges(size)
    for offset, length in ranges:
        digest.update(os.pread(fd, length, offset))
    return digest.hexdigest()


def sample_ranges(size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the bytes sampled from a file of ``size`` (> 8 MiB) bytes."""
    inner_start, inner_end = HEAD_BYTES, size - TAIL_BYTES
    span = inner_end - inner_start - BLOCK_BYTES
    blocks = [
        (inner_start + span * (i + 1) // (N_BLOCKS + 1), BLOCK_BYTES) for i in range(N_BLOCKS)
    ]
    return [(0, HEAD_BYTES), *blocks, (inner_end, TAIL_BYTES)]


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of every byte of the file (masks, bulk RNA); a symlink is followed.

    Raises:
        OSError: The file cannot be read, or is no regular file (a FIFO is never opened blocking).
    """
    with open(open_regular(path, follow_symlinks=True), "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def identity_change(recorded: SlideIdentity | None, current: SlideIdentity) -> str:
    """Why a done file recording ``recorded`` is not from the slide ``current``; ``""``: it is.

    No identity (an older histoserve's file) or another digest method is a
    change too: never trusted, embedded again once.
    """
    if recorded is None:
        return "the done file records no slide identity (an older histoserve wrote it)"
    if recorded.method != current.method:
        return (
            f"the done file's slide digest is {recorded.method or 'unknown'}, not {current.method}"
        )
    change = identity_difference(recorded, current)
    return f"slide changed since the done file ({change})" if change else ""


def identity_difference(before: SlideIdentity, after: SlideIdentity) -> str:
    """How the content differs (size, files, sampled digest), for people; ``""`` when it does not.

    Same content is the same slide, wherever it lies now and whatever its mtime:
    a moved path is said only beside a content change.
    """
    if (before.size, before.digest, before.files) == (after.size, after.digest, after.files):
        return ""
    details = []
    if before.path != after.path:
        details.append(f"path {before.path} -> {after.path}")
    if before.files != after.files:
        details.append(f"{before.files} -> {after.files} files")
    if before.size != after.size:
        details.append(f"size {before.size:,} -> {after.size:,} bytes")
    else:
        details.append(f"same size ({after.size:,} bytes), other content")
    return "; ".join(details)
