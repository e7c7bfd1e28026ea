"""Per-slide HDF5 feature files, written atomically (:mod:`~histoserve.atomic`).

``<out>/<slide_id>.h5`` holds the datasets ``features`` (float32 ``[N, D]``),
``predictions`` (float32 ``[N, K]``, when the mode has them), ``coords``
(int64 ``[N, 2]``, level-0 top-left x, y, rows by y then x) and
``tissue_fraction`` (float32 ``[N]``), with the run's facts as file
attributes: the ``flat`` layout. ``coords`` also carries the attribute names
TRIDENT (``patch_size``, ``patch_size_level0``, ``level0_magnification``,
``target_magnification``, ``overlap``, ``name``, ``savetodir``) and CLAM
(``patch_level``, ``downsample``, ``level_dim``, ``downsampled_level_dim``)
write on their coordinate datasets, but ``patch_size`` here follows TRIDENT
(the tile edge at the target scale): CLAM's meaning (the edge read at
``patch_level``) is ``read_size``, so CLAM would read the wrong area from
this file when tiles are resized. The files those tools read unchanged are
written by ``--layout trident`` and ``--layout clam``
(:mod:`~histoserve.results.layouts`).

A file is written under a hidden temporary name in the same folder, flushed,
fsynced and ``os.replace``d to its final name, so a crash leaves either the
old state or a temp file that :func:`is_done` never looks at. A finished file
also carries ``complete = True``, written last, and the identity of the slide
it was made from (``slide_identity``, :mod:`~histoserve.slides.identity`),
which a run compares with the slide before it skips one. A done file is
read only when it is a regular file (not a symlink, FIFO or folder: those are
not done, and are replaced when the slide is written).

A slide with unreadable tiles is written to ``<out>/incomplete/<slide_id>.h5``
with ``complete = False`` (:func:`incomplete_dir`), never to the final name,
unless the run accepts that many (``--accept-bad-tiles``): then the final file
carries ``n_bad_tiles`` > 0, and :func:`is_done` counts it done only for a run
that accepts as many.

The run's ``status.csv`` is :mod:`~histoserve.results.status`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from histoserve.atomic import atomic_path, open_regular, remove_file
from histoserve.errors import SlideError
from histoserve.slides.grid import TilePlan
from histoserve.slides.readers import SlideReader

T = TypeVar("T")
INCOMPLETE_DIR = "incomplete"
COMPLETE_ATTR = "complete"


def config_hash(settings: Mapping[str, Any]) -> str:
    """A stable hex digest of everything that shapes a slide's output.

    Callers pass the model name, package sha256, target mpp, tile size, tissue
    method and threshold, mode, mpp override and the like; key order does not
    matter. Two runs with equal settings get equal hashes in any process.
    """
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def final_path(out_dir: Path, slide_id: str) -> Path:
    """Where a slide's finished file lives: ``out_dir / f"{slide_id}.h5"``."""
    return Path(out_dir) / f"{slide_id}.h5"


def incomplete_dir(out_dir: Path) -> Path:
    """Where slides with unreadable tiles are written (``complete = False``): ``<out>/incomplete``."""
    return Path(out_dir) / INCOMPLETE_DIR


def discard_incomplete(out_dir: Path, slide_id: str) -> None:
    """Removes an earlier incomplete file of the slide (it is now written whole).

    Raises:
        UnsafeFolder: ``incomplete`` is a symlink (nothing is deleted through it).
    """
    remove_file(incomplete_dir(out_dir) / f"{slide_id}.h5", root=Path(out_dir))


def is_done(out_dir: Path, slide_id: str, config_hash: str, max_bad_tiles: int = 0) -> bool:
    """Whether the slide's final file exists, opens, is complete and has ``config_hash``.

    Any doubt (unreadable, no ``complete`` flag, another hash, datasets of
    different lengths, more ``n_bad_tiles`` than ``max_bad_tiles``) is False:
    the slide is embedded again. This checks the file alone; a run also
    checks that the file was made from the slide it names now (its
    ``slide_identity``, :meth:`~histoserve.results.layouts.Layout.check_done`).
    """
    path = final_path(out_dir, slide_id)
    return path.is_file() and h5_is_complete(path, config_hash, max_bad_tiles)


def h5_is_complete(path: Path, config_hash: str, max_bad_tiles: int = 0) -> bool:
    """Whether the HDF5 file at ``path`` is complete with ``config_hash`` (see :func:`is_done`)."""
    return done_attrs(path, config_hash, max_bad_tiles) is not None


def check_holder(done_file: Path, slide_id: str) -> None:
    """SlideError when ``done_file`` (``slide_id``'s) records another slide id.

    On a case-insensitive or normalising volume (macOS, SMB, some NFS) ``S1``
    and ``s1`` are one file: it is never resumed nor overwritten (``--force``
    included) for the other id.
    """
    holder = recorded_slide_id(done_file)
    if holder is not None and holder != slide_id:
        raise SlideError(
            f"{done_file} holds slide {holder!r}, not {slide_id!r}: on this volume the two "
            "ids name one file (they differ only by case or Unicode form); give one another id"
        )


def read_h5(
    path: Path, read: Callable[[Any], T], errors: tuple[type[BaseException], ...]
) -> T | None:
    """``read(file)`` of the HDF5 file at ``path``; None when it is missing, no regular file
    (opened without blocking or following a symlink), or ``read`` raises one of ``errors``."""
    import h5py

    try:
        fd = open_regular(path)
    except OSError:
        return None
    try:
        with open(fd, "rb") as handle, h5py.File(handle, "r") as f:
            return read(f)
    except errors:
        return None


_H5_ERRORS = (OSError, KeyError, ValueError, TypeError)


def recorded_slide_id(path: Path) -> str | None:
    """The ``slide_id`` the HDF5 file at ``path`` records; None when none is there or readable."""
    value = read_h5(path, lambda f: f.attrs.get("slide_id"), _H5_ERRORS)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def done_attrs(path: Path, config_hash: str, max_bad_tiles: int = 0) -> dict[str, Any] | None:
    """The file attributes of a complete HDF5 file with ``config_hash``, else None.

    None for any doubt, as :func:`is_done` says (a missing file included, and
    anything but a regular file: opened without blocking or following a symlink).
    """

    def read(f: Any) -> dict[str, Any] | None:
        attrs = dict(f.attrs)
        if not bool(attrs.get(COMPLETE_ATTR, False)):
            return None
        if str(attrs.get("config_hash", "")) != config_hash:
            return None
        if int(attrs.get("n_bad_tiles", 0)) > max_bad_tiles:
            return None
        n = f["coords"].shape[0]
        names = ("features", "predictions", "tissue_fraction")
        lengths = [f[name].shape[0] for name in names if name in f]
        return attrs if all(length == n for length in lengths) else None

    return read_h5(path, read, _H5_ERRORS)


@dataclass
class SlideResult:
    """What :func:`write_slide` writes for one slide.

    Attributes:
        features: float32 ``[N, D]`` embeddings, or None when the mode has none.
        predictions: float32 ``[N, K]``, or None when the mode has none.
        coords: int64 ``[N, 2]`` level-0 (x, y), ordered by y then x.
        tissue_fraction: float32 ``[N]``.
        attrs: File attributes (see :func:`plan_attrs`, plus slide_id,
            slide_path, model, package sha256/spec, tissue method/threshold,
            config_hash, histoserve version). None values are left out;
            dicts and lists are stored as JSON text.
    """

    features: np.ndarray | None
    predictions: np.ndarray | None
    coords: np.ndarray
    tissue_fraction: np.ndarray
    attrs: dict[str, Any] = field(default_factory=dict)


def plan_attrs(reader: SlideReader, plan: TilePlan) -> dict[str, Any]:
    """The attributes a tile plan contributes to a slide's file (scale, level, geometry)."""
    level = plan.read_level
    level_w, level_h = reader.level_dimensions[level]
    return {
        "target_mpp": plan.target_mpp,
        "level0_mpp": plan.level0_mpp,
        "mpp_source": plan.mpp_source,
        "tile_size": plan.tile_size,
        "patch_size_level0": plan.patch_size_level0,
        "read_level": level,
        "read_size": plan.read_size,
        "read_downsample": float(reader.level_downsamples[level]),
        "read_level_width": int(level_w),
        "read_level_height": int(level_h),
        "level0_width": plan.level0_width,
        "level0_height": plan.level0_height,
        "slide_backend": reader.backend,
        **({"overlap": plan.overlap} if plan.overlap else {}),
    }


def coords_attrs(attrs: Mapping[str, Any], slide_id: str, out_dir: Path) -> dict[str, Any]:
    """TRIDENT/CLAM attributes for the ``coords`` dataset, derived from the file attributes."""
    overlap = int(attrs.get("overlap", 0))
    out: dict[str, Any] = {"name": slide_id, "savetodir": str(out_dir), "overlap": overlap}
    if "tile_size" in attrs:
        out["patch_size"] = int(attrs["tile_size"])
    for key in ("patch_size_level0", "level0_width", "level0_height"):
        if key in attrs:
            out[key] = int(attrs[key])
    if "level0_mpp" in attrs:
        out["level0_magnification"] = magnification(float(attrs["level0_mpp"]))
    if "target_mpp" in attrs:
        out["target_magnification"] = magnification(float(attrs["target_mpp"]))
    if "read_level" in attrs:
        out["patch_level"] = int(attrs["read_level"])
    if "read_downsample" in attrs:
        d = float(attrs["read_downsample"])
        out["downsample"] = np.array([d, d])
    if "read_level_width" in attrs and "read_level_height" in attrs:
        dims = np.array([attrs["read_level_width"], attrs["read_level_height"]], np.int64)
        out["level_dim"] = dims
        out["downsampled_level_dim"] = dims
    return out


def magnification(mpp: float) -> int:
    """Objective magnification by the usual convention (10 um/px at 1x: 0.25 -> 40, 0.5 -> 20)."""
    return round(10.0 / mpp)


def file_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The run's facts as HDF5 attributes: dicts and lists as JSON text, paths as text, no None."""
    return {key: _attr_value(value) for key, value in attrs.items() if value is not None}


def _attr_value(value: Any) -> Any:
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, Path):
        return str(value)
    return value


def checked_arrays(result: SlideResult) -> dict[str, np.ndarray]:
    """The result's datasets as written (float32, int64 ``[N, 2]`` coords); ValueError when
    their lengths differ."""
    coords = np.asarray(result.coords, dtype=np.int64).reshape(-1, 2)
    n = len(coords)
    arrays = {"coords": coords, "tissue_fraction": np.asarray(result.tissue_fraction, np.float32)}
    if result.features is not None:
        arrays["features"] = np.asarray(result.features, np.float32)
    if result.predictions is not None:
        arrays["predictions"] = np.asarray(result.predictions, np.float32)
    for name, array in arrays.items():
        if array.shape[0] != n:
            raise ValueError(f"{name} has {array.shape[0]} rows but coords has {n}")
    return arrays


def write_slide(
    out_dir: Path,
    slide_id: str,
    result: SlideResult,
    *,
    complete: bool = True,
    root: Path | None = None,
    before_commit: Callable[[], None] | None = None,
) -> Path:
    """Write ``result`` to ``out_dir/<slide_id>.h5`` atomically; return the final path.

    ``complete=False`` (a slide with holes, see :func:`incomplete_dir`) marks
    the file so; the folder is created when missing. ``root``: the run's
    ``--out`` when ``out_dir`` is a folder in it (no symlink followed below
    it); ``before_commit``: called right before the rename (what it raises
    writes nothing; see :func:`~histoserve.atomic.atomic_path`).

    Raises:
        ValueError: Arrays of different lengths.
        OSError: The folder cannot be written (the temp file is removed).
    """
    import h5py

    out_dir = Path(out_dir)
    arrays = checked_arrays(result)
    final = final_path(out_dir, slide_id)
    commit = atomic_path(final, root=root, before_replace=before_commit, lock=False)
    with commit as tmp, h5py.File(tmp, "w") as f:
        for name, array in arrays.items():
            f.create_dataset(name, data=array)
        for key, value in coords_attrs(result.attrs, slide_id, out_dir).items():
            f["coords"].attrs[key] = value
        for key, value in file_attrs(result.attrs).items():
            f.attrs[key] = value
        f.attrs[COMPLETE_ATTR] = complete
    return final
