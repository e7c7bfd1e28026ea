"""Which slides a run embeds: paths or a CSV manifest, and this process's shard of them.

A slide id names the output file (``<out>/<slide_id>.h5``) and the claim
(``<out>/.claims/<slide_id>.lock``), so it must be a plain file name; two
slides with one id would overwrite each other, so duplicates are a usage
error, never a silent skip.

Sharding (``--shard I/N``) takes every N-th slide of the list sorted by slide
id, starting at the I-th: shards are disjoint and cover the list, whatever
order the paths were given in. ``--shard N`` alone reads ``I`` from
``$JOB_COMPLETION_INDEX``, so one command line serves every pod of a
Kubernetes Indexed Job.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from predictor.client.embed.errors import UsageError

MANIFEST_COLUMNS = ("slide_id", "path", "mpp", "bulk_rna", "mask")
SHARD_INDEX_ENV = "JOB_COMPLETION_INDEX"


@dataclass(frozen=True)
class SlideEntry:
    """One slide to embed.

    Attributes:
        slide_id: Output and claim name (a plain file name).
        path: The slide file.
        mpp: Level-0 microns per pixel from the manifest (ahead of the slide's metadata).
        bulk_rna: Per-slide bulk RNA counts file, for models that take it.
        mask: Per-slide tissue mask or region (GeoJSON or binary image; see
            :mod:`~predictor.client.embed.masks`), instead of tissue detection.
    """

    slide_id: str
    path: Path
    mpp: float | None = None
    bulk_rna: Path | None = None
    mask: Path | None = None

    def __post_init__(self) -> None:
        check_slide_id(self.slide_id)
        if self.mpp is not None and not (math.isfinite(self.mpp) and self.mpp > 0):
            raise UsageError(
                f"slide {self.slide_id!r}: mpp must be a positive number, got {self.mpp}"
            )


def check_slide_id(slide_id: str) -> str:
    """Return ``slide_id`` if it is usable as a file name, else raise :class:`UsageError`."""
    bad = (
        not slide_id
        or slide_id in (".", "..")
        or slide_id.startswith(".")
        or "/" in slide_id
        or "\\" in slide_id
        or "\x00" in slide_id
    )
    if bad:
        raise UsageError(
            f"slide id {slide_id!r} is not a plain file name (no '/', no leading '.'): "
            "rename the file or set the slide_id column of the manifest"
        )
    return slide_id


def _check_unique(entries: Sequence[SlideEntry]) -> None:
    seen: dict[str, Path] = {}
    for entry in entries:
        if entry.slide_id in seen:
            raise UsageError(
                f"duplicate slide id {entry.slide_id!r}: {seen[entry.slide_id]} and {entry.path}; "
                "give each slide its own id with a manifest (slide_id,path)"
            )
        seen[entry.slide_id] = entry.path


def entries_from_paths(
    paths: Sequence[str | Path], id_of: Callable[[Path], str] | None = None
) -> list[SlideEntry]:
    """Slides given on the command line; the id is ``id_of(path)``, else the file stem.

    (``a/b/S1.svs`` -> ``S1``; the layouts pass their tool's rule, see
    :func:`predictor.client.embed.layouts.slide_id_from_path`.)
    """
    entries = [SlideEntry((id_of or _stem)(Path(p)), Path(p)) for p in paths]
    _check_unique(entries)
    return entries


def _stem(path: Path) -> str:
    return path.stem


def _parse_mpp(text: str, where: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError as exc:
        raise UsageError(f"{where}: mpp {text!r} is not a number") from exc
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{where}: mpp must be a positive number, got {text!r}")
    return value


def _row_entry(row: Mapping[str, str | None], folder: Path, where: str) -> SlideEntry:
    slide_id = (row.get("slide_id") or "").strip()
    path_text = (row.get("path") or "").strip()
    if not slide_id or not path_text:
        raise UsageError(f"{where}: slide_id and path must not be empty")
    path = Path(path_text)
    bulk_text = (row.get("bulk_rna") or "").strip()
    bulk = Path(bulk_text) if bulk_text else None
    mask_text = (row.get("mask") or "").strip()
    mask = Path(mask_text) if mask_text else None
    try:
        return SlideEntry(
            slide_id=slide_id,
            path=path if path.is_absolute() else folder / path,
            mpp=_parse_mpp(row.get("mpp") or "", where),
            bulk_rna=None if bulk is None else bulk if bulk.is_absolute() else folder / bulk,
            mask=None if mask is None else mask if mask.is_absolute() else folder / mask,
        )
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from exc


def read_manifest(path: Path) -> list[SlideEntry]:
    """Read a CSV manifest with a header: ``slide_id,path`` and optional ``mpp``, ``bulk_rna``, ``mask``.

    Relative paths are resolved against the CSV's folder, so a manifest travels
    with its slides. An empty ``mpp`` cell means "from the slide's metadata".

    Raises:
        UsageError: Unreadable file, missing or unknown columns, a bad row,
            duplicate slide ids or no rows at all (the message names the line).
    """
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            columns = [c.strip() for c in (reader.fieldnames or [])]
            reader.fieldnames = columns
            _check_columns(columns, path)
            entries = [
                _row_entry(row, path.parent, f"{path} line {reader.line_num}")
                for row in reader
                if any((v or "").strip() for v in row.values() if isinstance(v, str))
            ]
    except OSError as exc:
        raise UsageError(f"cannot read manifest {path}: {exc}") from exc
    except csv.Error as exc:
        raise UsageError(f"manifest {path} is not valid CSV: {exc}") from exc
    if not entries:
        raise UsageError(f"manifest {path} lists no slides")
    _check_unique(entries)
    return entries


def _check_columns(columns: Sequence[str], path: Path) -> None:
    missing = [c for c in ("slide_id", "path") if c not in columns]
    unknown = [c for c in columns if c not in MANIFEST_COLUMNS]
    if missing or unknown:
        raise UsageError(
            f"manifest {path}: header must be slide_id,path[,mpp][,bulk_rna][,mask]; "
            f"missing {missing}, unknown {unknown} (got {list(columns)})"
        )


def parse_shard(text: str | None, env: Mapping[str, str]) -> tuple[int, int] | None:
    """Parse ``--shard``: ``"I/N"``, or ``"N"`` with ``I`` from ``$JOB_COMPLETION_INDEX``.

    Returns:
        ``(I, N)`` with ``0 <= I < N``, or ``None`` when ``text`` is ``None`` (no sharding).

    Raises:
        UsageError: Not of that form, ``N < 1``, ``I >= N``, or ``"N"`` alone
            without ``$JOB_COMPLETION_INDEX``.
    """
    if text is None:
        return None
    parts = text.strip().split("/")
    if len(parts) == 1:
        if SHARD_INDEX_ENV not in env:
            raise UsageError(
                f"--shard {text}: a shard count alone takes the index from ${SHARD_INDEX_ENV} "
                "(set by a Kubernetes Indexed Job), which is not set; use --shard I/N"
            )
        index_text, count_text = env[SHARD_INDEX_ENV], parts[0]
    elif len(parts) == 2:
        index_text, count_text = parts
    else:
        raise UsageError(f"--shard must be I/N or N, got {text!r}")
    try:
        index, count = int(index_text), int(count_text)
    except ValueError as exc:
        raise UsageError(f"--shard must be I/N or N with integers, got {text!r}") from exc
    if count < 1:
        raise UsageError(f"--shard {text!r}: the shard count must be at least 1, got {count}")
    if not 0 <= index < count:
        raise UsageError(f"--shard {text!r}: the index must be in 0..{count - 1}, got {index}")
    return index, count


def select_shard(entries: Sequence[SlideEntry], shard: tuple[int, int] | None) -> list[SlideEntry]:
    """This shard's slides: sorted by slide id, every N-th starting at the I-th."""
    ordered = sorted(entries, key=lambda e: e.slide_id)
    if shard is None:
        return ordered
    index, count = shard
    return ordered[index::count]
