"""Which slides a run embeds: paths or a CSV manifest, and this process's shard of them.

A slide id names the output file (``<out>/<slide_id>.h5``) and the claim
(``<out>/.claims/<slide_id>.lock``), so it must be a plain file name that
fits every file a slide gets: at most :data:`MAX_SLIDE_ID_BYTES` (244) bytes
of UTF-8, the 255-byte file name limit of ext4, XFS, NFS, APFS and NTFS less
the longest suffix a slide's files add (``_patches.h5`` of ``--layout
trident``; temp names are cut to fit, see ``output.temp_path``), and no
control characters (C0, DEL, C1, Unicode line and paragraph separators: they
would break ``status.csv`` lines and terminals). Two slides with one id would
overwrite each other, and so would two ids that differ only by case or
Unicode normalisation (``S1`` and ``s1``, ``é`` composed or not) on a
case-insensitive volume (macOS, Windows, many SMB shares): both are usage
errors naming both, never a silent skip.

Sharding (``--shard I/N``) takes every N-th slide of the list sorted by slide
id, starting at the I-th: shards are disjoint and cover the list, whatever
order the paths were given in. ``--shard N`` alone reads ``I`` from
``$JOB_COMPLETION_INDEX``, else ``$SLURM_ARRAY_TASK_ID``, so one command line
serves every pod of a Kubernetes Indexed Job or every task of a Slurm array;
``--shard auto`` takes ``N`` from the Slurm array too (:func:`slurm_shard`).
"""

from __future__ import annotations

import csv
import math
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from histoserve.errors import UsageError

MANIFEST_COLUMNS = ("slide_id", "path", "mpp", "bulk_rna", "mask")
SHARD_INDEX_ENV = "JOB_COMPLETION_INDEX"
SLURM_INDEX_ENV = "SLURM_ARRAY_TASK_ID"
SLURM_ARRAY_ENV = ("SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX")
NAME_MAX_BYTES = 255
LONGEST_SUFFIX = "_patches.h5"  # trident's coordinates; .h5, .pt, .lock, .geojson are shorter
MAX_SLIDE_ID_BYTES = NAME_MAX_BYTES - len(LONGEST_SUFFIX)
_CONTROL_CATEGORIES = ("Cc", "Zl", "Zp")  # C0, DEL, C1; U+2028, U+2029


@dataclass(frozen=True)
class SlideEntry:
    """One slide to embed.

    Attributes:
        slide_id: Output and claim name (a plain file name).
        path: The slide file.
        mpp: Level-0 microns per pixel from the manifest (ahead of the slide's metadata).
        bulk_rna: Per-slide bulk RNA counts file, for models that take it.
        mask: Per-slide tissue mask or region (GeoJSON or binary image; see
            :mod:`~histoserve.tissue.masks`), instead of tissue detection.
        source: Where it was given (``m.csv line 3``, a path), for messages.
    """

    slide_id: str
    path: Path
    mpp: float | None = None
    bulk_rna: Path | None = None
    mask: Path | None = None
    source: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        check_slide_id(self.slide_id)
        if self.mpp is not None and not (math.isfinite(self.mpp) and self.mpp > 0):
            raise UsageError(
                f"slide {self.slide_id!r}: mpp must be a positive number, got {self.mpp}"
            )


def check_slide_id(slide_id: str) -> str:
    """Return ``slide_id`` if it is usable as a file name, else raise :class:`UsageError`.

    A plain file name (no ``/``, ``\\``, NUL, leading ``.``), valid UTF-8 of at
    most :data:`MAX_SLIDE_ID_BYTES` bytes, without control characters.
    """
    fix = "rename the file or set the slide_id column of the manifest"
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
            f"slide id {shown_id(slide_id)} is not a plain file name (no '/', no leading '.'): {fix}"
        )
    try:
        n_bytes = len(slide_id.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a file name with bytes that are no UTF-8
        raise UsageError(f"slide id {shown_id(slide_id)} is not valid UTF-8: {fix}") from exc
    if n_bytes > MAX_SLIDE_ID_BYTES:
        raise UsageError(
            f"slide id {shown_id(slide_id)} is {n_bytes} bytes of UTF-8, over the limit of "
            f"{MAX_SLIDE_ID_BYTES} (file names stop at {NAME_MAX_BYTES} bytes and a slide's "
            f"files add up to {len(LONGEST_SUFFIX)}): {fix} with a shorter id"
        )
    control = next((c for c in slide_id if unicodedata.category(c) in _CONTROL_CATEGORIES), None)
    if control is not None:
        raise UsageError(
            f"slide id {shown_id(slide_id)} has the control character U+{ord(control):04X} "
            f"(no control characters, line breaks or escapes in ids): {fix}"
        )
    return slide_id


def shown_id(slide_id: str, max_chars: int = 60) -> str:
    """``slide_id`` for a message: quoted, escaped (``repr``), cut after ``max_chars``."""
    if len(slide_id) <= max_chars:
        return repr(slide_id)
    return f"{slide_id[:max_chars]!r}... ({len(slide_id)} characters)"


def folded_id(slide_id: str) -> str:
    """``slide_id`` as a case-insensitive volume may see it: NFKC, case folded, NFKC again."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", slide_id).casefold())


def check_unique(entries: Sequence[SlideEntry]) -> None:
    """UsageError when two entries share an id, or ids that differ only by case or normalisation.

    The message names both ids and where each was given (manifest line, path).
    """
    seen: dict[str, SlideEntry] = {}
    for entry in entries:
        other = seen.setdefault(folded_id(entry.slide_id), entry)
        if other is entry:
            continue
        where = f"{_where(other)} and {_where(entry)}"
        if other.slide_id == entry.slide_id:
            raise UsageError(
                f"duplicate slide id {shown_id(entry.slide_id)}: {where}; "
                "give each slide its own id with a manifest (slide_id,path)"
            )
        raise UsageError(
            f"slide ids {shown_id(other.slide_id)} and {shown_id(entry.slide_id)} differ only by "
            f"case or Unicode normalisation ({where}): on a case-insensitive volume (macOS, "
            "Windows, many SMB shares) they name one file; rename one"
        )


def _where(entry: SlideEntry) -> str:
    return entry.source or str(entry.path)


def entries_from_paths(
    paths: Sequence[str | Path], id_of: Callable[[Path], str] | None = None
) -> list[SlideEntry]:
    """Slides given on the command line; the id is ``id_of(path)``, else the file stem.

    (``a/b/S1.svs`` -> ``S1``; the layouts pass their tool's rule, see
    :func:`histoserve.results.layouts.slide_id_from_path`.)
    """
    entries = []
    for p in map(Path, paths):
        shown = str(p) if str(p).isprintable() else repr(str(p))  # no raw escapes in messages
        try:
            entries.append(SlideEntry((id_of or _stem)(p), p, source=shown))
        except UsageError as exc:
            raise UsageError(f"{shown}: {exc}") from exc
    check_unique(entries)
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
    from histoserve.limits import mpp_problem  # the range slides' metadata must meet

    problem = mpp_problem(value)
    if problem is not None:
        raise UsageError(f"{where}: mpp {text!r}: {problem}")
    return value


def _row_entry(row: Mapping[str, str | None], folder: Path, where: str) -> SlideEntry:
    slide_id = (row.get("slide_id") or "").strip()
    path_text = (row.get("path") or "").strip()
    if not slide_id or not path_text:
        raise UsageError(f"{where}: slide_id and path must not be empty")
    for column in ("path", "bulk_rna", "mask"):
        _check_path_text(row.get(column) or "", column, where)
    path = Path(path_text)
    bulk_text = (row.get("bulk_rna") or "").strip()
    bulk = Path(bulk_text) if bulk_text else None
    mask_text = (row.get("mask") or "").strip()
    mask = Path(mask_text) if mask_text else None
    mpp = _parse_mpp(row.get("mpp") or "", where)  # its errors name the line already
    try:
        return SlideEntry(
            slide_id=slide_id,
            path=path if path.is_absolute() else folder / path,
            mpp=mpp,
            bulk_rna=None if bulk is None else bulk if bulk.is_absolute() else folder / bulk,
            mask=None if mask is None else mask if mask.is_absolute() else folder / mask,
            source=where,
        )
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from exc


def _check_path_text(text: str, column: str, where: str) -> None:
    """UsageError naming the line when a path cell holds a NUL or another control character."""
    control = next((c for c in text if unicodedata.category(c) in _CONTROL_CATEGORIES), None)
    if control is not None:
        raise UsageError(
            f"{where}: {column} {shown_id(text)} has the control character U+{ord(control):04X} "
            "(paths with control characters are refused: a stray byte?); fix that cell"
        )


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
    except UnicodeDecodeError as exc:
        raise _not_utf8(path) from exc
    if not entries:
        raise UsageError(f"manifest {path} lists no slides")
    check_unique(entries)
    return entries


def _not_utf8(path: Path) -> UsageError:
    """The UsageError for a manifest that is not UTF-8, naming its first bad byte's line."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")  # a byte-order mark is valid UTF-8: offsets are the file's own
    except UnicodeDecodeError as exc:
        line, byte = raw.count(b"\n", 0, exc.start) + 1, raw[exc.start]
        where = f"line {line}: byte 0x{byte:02x} (byte {exc.start + 1} of the file)"
    else:
        where = "a byte"
    return UsageError(
        f"manifest {path} is not UTF-8 text: {where} is not UTF-8 (a file saved as "
        "latin-1 or Windows-1252, as Excel's plain 'CSV' does); re-save it as UTF-8 "
        "(Excel: 'CSV UTF-8 (Comma delimited)')"
    )


def _check_columns(columns: Sequence[str], path: Path) -> None:
    missing = [c for c in ("slide_id", "path") if c not in columns]
    unknown = [c for c in columns if c not in MANIFEST_COLUMNS]
    if missing or unknown:
        raise UsageError(
            f"manifest {path}: header must be slide_id,path[,mpp][,bulk_rna][,mask]; "
            f"missing {missing}, unknown {unknown} (got {list(columns)})"
        )


def parse_shard(text: str | None, env: Mapping[str, str]) -> tuple[int, int] | None:
    """Parse ``--shard``: ``"I/N"``; ``"N"`` with ``I`` from the environment; or ``"auto"``.

    ``"N"``: ``I`` is ``$JOB_COMPLETION_INDEX`` (a Kubernetes Indexed Job), else
    ``$SLURM_ARRAY_TASK_ID`` (a Slurm array task, ``--array=0-<N-1>``; re-submitting
    only some ids, ``--array=17,203``, keeps every task's shard). ``"auto"``: ``I``
    and ``N`` from Slurm alone (:func:`slurm_shard`).

    Returns:
        ``(I, N)`` with ``0 <= I < N``, or ``None`` when ``text`` is ``None`` (no sharding).

    Raises:
        UsageError: Not of that form, ``N < 1``, ``I >= N``, ``"N"`` alone with neither
            variable set, ``"auto"`` outside a whole Slurm array.
    """
    if text is None:
        return None
    parts = text.strip().split("/")
    if text.strip() == "auto":
        return slurm_shard(env)
    if len(parts) == 1:
        source = next((v for v in (SHARD_INDEX_ENV, SLURM_INDEX_ENV) if v in env), None)
        if source is None:
            raise UsageError(
                f"--shard {text}: a shard count alone takes the index from ${SHARD_INDEX_ENV} "
                f"(a Kubernetes Indexed Job) or ${SLURM_INDEX_ENV} (a Slurm array), and "
                "neither is set; use --shard I/N"
            )
        index_text, count_text = env[source], parts[0]
    elif len(parts) == 2:
        index_text, count_text = parts
    else:
        raise UsageError(f"--shard must be I/N or N (or auto), got {text!r}")
    return _shard_numbers(text, index_text, count_text)


def _shard_numbers(text: str, index_text: str, count_text: str) -> tuple[int, int]:
    try:
        index, count = int(index_text), int(count_text)
    except ValueError as exc:
        raise UsageError(f"--shard must be I/N or N with integers, got {text!r}") from exc
    if count < 1:
        raise UsageError(f"--shard {text!r}: the shard count must be at least 1, got {count}")
    if not 0 <= index < count:
        raise UsageError(
            f"--shard {text!r}: the index must be in 0..{count - 1}, got {index} "
            "(a Slurm array for N shards is --array=0-<N-1>)"
        )
    return index, count


def slurm_shard(env: Mapping[str, str]) -> tuple[int, int]:
    """``(I, N)`` of ``--shard auto``: ``$SLURM_ARRAY_TASK_ID`` of ``$SLURM_ARRAY_TASK_COUNT``.

    Only for a whole array from 0 (``SLURM_ARRAY_TASK_MIN`` 0, ``MAX`` ``COUNT - 1``):
    a re-submission of some ids (``--array=17,203``) has another count, and the
    shards would change under the slides; it is a usage error naming ``--shard N``.

    Raises:
        UsageError: Not in a Slurm array, or not a whole one from 0.
    """
    names = (SLURM_INDEX_ENV, *SLURM_ARRAY_ENV)
    missing = [n for n in names if n not in env]
    if missing:
        raise UsageError(
            f"--shard auto reads a Slurm array's ${SLURM_INDEX_ENV} and ${SLURM_ARRAY_ENV[0]}; "
            f"${missing[0]} is not set: use --shard I/N, or --shard N in an Indexed Job"
        )
    index, count, low, high = (env[n] for n in names)
    if (low, high) != ("0", str(_int_or(count) - 1)):
        raise UsageError(
            f"--shard auto: this Slurm array has ids {low}-{high} but {count} tasks (only some "
            f"ids submitted?): its shards would differ from the first run's; give the shard "
            "count, --shard N (the index is still $SLURM_ARRAY_TASK_ID)"
        )
    return _shard_numbers("auto", index, count)


def _int_or(text: str, default: int = -2) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def select_shard(entries: Sequence[SlideEntry], shard: tuple[int, int] | None) -> list[SlideEntry]:
    """This shard's slides: sorted by slide id, every N-th starting at the I-th."""
    ordered = sorted(entries, key=lambda e: e.slide_id)
    if shard is None:
        return ordered
    index, count = shard
    return ordered[index::count]
