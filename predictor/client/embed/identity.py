"""A slide's identity: which bytes a done file was made from, and whether they are still there.

Resume must never keep features made from another slide: a manifest corrected
to map ``PATIENT_042`` to another file, a slide re-scanned or re-exported under
its old name. So every done file records the identity of the slide it was made
from (:class:`SlideIdentity`, the ``slide_identity`` attribute), and a re-run
compares it with the slide the run names now (:func:`identity_change`): any
difference re-embeds the slide, with the difference in its status line. A
done file without an identity (an older histoserve's) is not trusted either:
its slide is embedded once more. Identity is taken again once a slide is
embedded; a slide that changed meanwhile (a copy still being written) fails.

What counts is the content: the size in bytes and a SHA-256 over a fixed
sample of the bytes (the size, the first and the last MiB and 32 blocks of
64 KiB evenly spaced between them; a file of at most 8 MiB is digested whole).
A full SHA-256 would read every byte of every slide on every resume check
(4 to 7 s for a 4 GiB slide here, against 4 to 18 ms for the sample:
docs/performance.md). The resolved path and the mtime are recorded too and
said in the message, but neither counts alone: moving a cohort to another
mount, or copying it without keeping mtimes, must not re-embed every slide.
The limit: an edit in place that keeps the size and touches none of the
sampled bytes is not seen (``--force`` re-embeds).

A slide made of several files is all of them: a DICOM slide (its folder, or one
of its files: OpenSlide reads the whole series from the folder) is every DICOM
file of the folder, an MRXS slide its ``.mrxs`` and every file of its data
folder (``<stem>/``). Their names, sizes and sampled digests make its digest.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from predictor.client.embed.errors import SlideError
from predictor.client.embed.readers_dicom import is_dicom_file

IDENTITY_ATTR = "slide_identity"
DIGEST_METHOD = "sha256-sample-v1"  # another method (a future one) never compares equal
WHOLE_BELOW_BYTES = 8 << 20
HEAD_BYTES = TAIL_BYTES = 1 << 20
BLOCK_BYTES, N_BLOCKS = 64 << 10, 32


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
            data = json.loads(value)
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
            st = os.stat(member)
            size, mtime_ns = size + st.st_size, max(mtime_ns, st.st_mtime_ns)
            digest.update(f"{name}\0{st.st_size}\0{sampled_sha256(member)}\n".encode())
    except FileNotFoundError as exc:
        raise SlideError(f"slide file not found: {path}") from exc
    except OSError as exc:
        raise SlideError(f"cannot read slide {path}: {exc.strerror or exc}") from exc
    return SlideIdentity(str(resolved), size, mtime_ns, digest.hexdigest(), len(members))


def _members(resolved: Path) -> list[tuple[str, Path]]:
    """The files a slide is, each with its name inside the slide (``""`` for a lone file).

    Names are relative to the slide's folder, so renaming or moving a slide
    keeps its identity; a DICOM series is its folder's DICOM files, an MRXS
    its ``.mrxs`` and the files of its data folder.
    """
    if resolved.is_dir():
        return _named(resolved, (p for p in resolved.iterdir() if is_dicom_file(p)))
    if not resolved.exists():
        raise FileNotFoundError(resolved)
    if resolved.suffix.lower() == ".dcm" or is_dicom_file(resolved):
        series = [p for p in resolved.parent.iterdir() if is_dicom_file(p)]
        return _named(resolved.parent, {*series, resolved})
    data = resolved.with_suffix("")
    if resolved.suffix.lower() == ".mrxs" and data.is_dir():
        return [("", resolved), *_named(data, data.rglob("*"))]
    return [("", resolved)]


def _named(folder: Path, paths: Iterable[Path]) -> list[tuple[str, Path]]:
    return sorted((p.relative_to(folder).as_posix(), p) for p in paths if p.is_file())


def sampled_sha256(path: Path) -> str:
    """Hex SHA-256 of the file's size and its fixed sample (the whole file up to 8 MiB).

    Raises:
        OSError: The file cannot be read.
    """
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        digest = hashlib.sha256(size.to_bytes(8, "little"))
        if size <= WHOLE_BELOW_BYTES:
            digest.update(fh.read())
            return digest.hexdigest()
        for offset, length in sample_ranges(size):
            digest.update(os.pread(fh.fileno(), length, offset))
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
    """Hex SHA-256 of every byte of the file (masks, bulk RNA, a layout's sibling files).

    Raises:
        OSError: The file cannot be read.
    """
    with open(path, "rb") as fh:
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
