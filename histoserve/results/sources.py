"""Feature files already on disk, of every layout: which there are, and one read back checked.

``histoserve aggregate FEATURES_DIR`` runs a slide head over tile features a
run (``histoserve embed``, TRIDENT or CLAM) already wrote. Where they are
depends on the layout (:func:`find_sources`):

- ``flat``: ``FEATURES_DIR/<id>.h5``;
- ``clam``: ``FEATURES_DIR/h5_files/<id>.h5``;
- ``trident``: ``FEATURES_DIR/<mag>x_<size>px_<overlap>px_overlap/features_<encoder>/<id>.h5``
  (FEATURES_DIR is TRIDENT's job folder, or one ``features_<encoder>`` folder itself);
- ``auto`` (the default): ``clam`` when there is an ``h5_files`` folder,
  ``trident`` when there is a ``*px_overlap`` folder or FEATURES_DIR is a
  ``features_*`` folder, else ``flat``.

Every layout's file holds ``features`` ``[N, D]`` and ``coords`` ``[N, 2]``
(level-0 top-left x, y). :func:`read_features` reads one back and checks it:
a regular file (no symlink, no FIFO), not marked incomplete, both datasets
there with N rows (N = 0 for a slide without tissue), finite features;
anything else is a :class:`~histoserve.errors.SlideError` naming the file
and the reason (a slide head refuses N = 0 itself). The tile edge at level 0 comes from the attributes each tool writes
(``patch_size_level0``; CLAM's ``patch_size`` x ``downsample``), else from
the coordinates' grid step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from histoserve import jsonsafe
from histoserve.atomic import open_regular
from histoserve.errors import SlideError, UsageError
from histoserve.results.siblings import digest_open, unchanged_since

SOURCE_LAYOUTS = ("auto", "flat", "trident", "clam")
_TRIDENT_COORDS = re.compile(r".+x_\d+px_\d+px_overlap$")


@dataclass(frozen=True)
class FeatureSource:
    """One slide's tile features on disk.

    Attributes:
        slide_id: The file's stem.
        path: The features file.
        root: The folder its slide-level results go in (``slide_features_<model>/``
            inside it): TRIDENT's coords folder, else FEATURES_DIR.
    """

    slide_id: str
    path: Path
    root: Path


@dataclass
class SlideFeatures:
    """One features file read back and checked.

    Attributes:
        features: ``[N, D]`` float32 (float16 kept as float16).
        coords: ``[N, 2]`` int64 level-0 top-left (x, y).
        patch_level0: Tile edge at level 0 (px).
        extent: Level-0 ``(width, height)`` of the slide (else of the tiles).
        attrs: The file's attributes (JSON text decoded where it is JSON).
        record: The SHA-256 and stat of the bytes read (``read_features(digest=True)``).
    """

    features: np.ndarray
    coords: np.ndarray
    patch_level0: int
    extent: tuple[int, int]
    attrs: dict[str, Any] = field(default_factory=dict)
    record: dict[str, Any] | None = None

    @property
    def slide_path(self) -> Path | None:
        """The slide the features were made from, when the file names it."""
        text = self.attrs.get("slide_path")
        return Path(str(text)) if text else None


def detect_layout(features_dir: Path) -> str:
    """The layout of ``features_dir`` (see the module docstring)."""
    if (features_dir / "h5_files").is_dir():
        return "clam"
    if features_dir.name.startswith("features_") or _trident_folders(features_dir):
        return "trident"
    return "flat"


def _trident_folders(features_dir: Path) -> list[Path]:
    return sorted(p for p in features_dir.iterdir() if p.is_dir() and _TRIDENT_COORDS.match(p.name))


def tiling_of(root: Path) -> str:
    """The TRIDENT coords folder's name (``20x_224px_0px_overlap``) a source root is, else ``""``.

    What tells two runs into one TRIDENT job folder apart (magnification, tile
    size, overlap); flat and CLAM folders hold one tiling only.
    """
    return root.name if _TRIDENT_COORDS.match(Path(root).name) else ""


def every_tiling(roots: Iterable[Path]) -> set[Path]:
    """``roots`` and every TRIDENT coords folder beside one of them (the job folder's other runs)."""
    found = {Path(r) for r in roots}
    for root in list(found):
        if tiling_of(root) and root.parent.is_dir():
            found.update(_trident_folders(root.parent))
    return found


def find_sources(
    features_dir: Path, layout: str = "auto", encoder: str | None = None, overlap: int | None = None
) -> list[FeatureSource]:
    """Every features file of ``features_dir`` in ``layout``, sorted by slide id.

    ``encoder``, ``overlap``: of a TRIDENT job folder, only ``features_<encoder>``
    folders, in coords folders of that overlap (``..._<overlap>px_overlap``).

    Raises:
        UsageError: No such folder, an unknown layout, a TRIDENT job folder
            with several encoders' features (name one ``features_*`` folder),
            or two files with one slide id.
    """
    features_dir = Path(features_dir)
    if not features_dir.is_dir():
        raise UsageError(f"{features_dir}: no such folder of feature files")
    if layout not in SOURCE_LAYOUTS:
        raise UsageError(f"--layout {layout!r}: must be one of {', '.join(SOURCE_LAYOUTS)}")
    layout = detect_layout(features_dir) if layout == "auto" else layout
    if layout == "clam":
        folders = [(features_dir / "h5_files", features_dir)]
    elif layout == "trident":
        folders = _trident_feature_folders(features_dir, encoder, overlap)
    else:
        folders = [(features_dir, features_dir)]
    sources = [
        FeatureSource(path.stem, path, root)
        for folder, root in folders
        for path in sorted(folder.glob("*.h5"))
        if not path.name.startswith(".")
    ]
    ids = [s.slide_id for s in sources]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise UsageError(
            f"{features_dir}: slide ids {twice[:5]} have several feature files "
            "(several TRIDENT coords folders?): name one features_<encoder> folder"
        )
    return sorted(sources, key=lambda s: s.slide_id)


def _trident_feature_folders(
    features_dir: Path, encoder: str | None, overlap: int | None
) -> list[tuple[Path, Path]]:
    """``(features_<encoder> folder, its coords folder)`` of a job folder, or of that folder."""
    if features_dir.name.startswith("features_"):
        return [(features_dir, features_dir.parent)]
    found = [
        (enc, coords)
        for coords in _trident_folders(features_dir)
        if overlap is None or coords.name.endswith(f"_{overlap}px_overlap")
        for enc in sorted(coords.glob("features_*"))
        if enc.is_dir() and (encoder is None or enc.name == f"features_{encoder}")
    ]
    if len(found) > 1:
        names = ", ".join(str(f.relative_to(features_dir)) for f, _ in found[:4])
        raise UsageError(
            f"{features_dir} holds the features of {len(found)} encoders or scales ({names}): "
            "pass the one features_<encoder> folder to aggregate"
        )
    return found


def read_features(path: Path, digest: bool = False) -> SlideFeatures:
    """The features file at ``path``, checked (see the module docstring).

    With ``digest``, the bytes parsed are the bytes hashed: one descriptor is
    hashed, then parsed, and must not have changed in between; the record
    (``SlideFeatures.record``) is what a result made from them stores, so a
    file renamed over ``path`` later is never taken for the one read.

    Raises:
        SlideError: ``"<path>: <reason>"``.
    """
    import h5py

    try:
        fd = open_regular(path)
    except OSError as exc:
        raise SlideError(f"{path}: cannot be read ({exc})") from exc
    record = None
    try:
        with open(fd, "rb") as handle:
            record = digest_open(handle) if digest else None
            with h5py.File(handle, "r") as f:
                attrs = {k: _attr(v) for k, v in f.attrs.items()}
                features, coords = _dataset(f, "features", path), _dataset(f, "coords", path)
                coord_attrs = {k: _attr(v) for k, v in f["coords"].attrs.items()}
            if record is not None and not unchanged_since(handle, record):
                raise SlideError(f"{path}: changed while it was read (another run writing it?)")
    except SlideError:
        raise
    except Exception as exc:  # h5py raises OSError, KeyError, ValueError, TypeError...
        raise SlideError(f"{path}: not a readable HDF5 features file ({exc})") from exc
    if attrs.get("complete") is False or attrs.get("complete") == 0:
        raise SlideError(f"{path}: marked incomplete (complete=False): embed the slide again")
    features, coords = _checked(path, features, coords)
    patch = _patch_level0(attrs, coord_attrs, coords)
    extent = _extent(attrs, coord_attrs, coords, patch)
    return SlideFeatures(features, coords, patch, extent, {**coord_attrs, **attrs}, record)


def _dataset(f: Any, name: str, path: Path) -> np.ndarray:
    if name not in f:
        hint = " (embedded with --mode prediction? aggregate needs an embedding mode)"
        raise SlideError(f"{path}: no {name!r} dataset{hint if name == 'features' else ''}")
    return np.asarray(f[name][()])


def _checked(path: Path, features: np.ndarray, coords: np.ndarray) -> tuple[np.ndarray, ...]:
    """``features`` ``[N, D]`` floating and finite, ``coords`` ``[N, 2]`` int64 (N may be 0)."""
    if features.ndim == 3 and features.shape[0] == 1:  # [1, N, D] as some tools save it
        features = features[0]
    if features.ndim != 2 or not np.issubdtype(features.dtype, np.floating):
        raise SlideError(f"{path}: features is {features.dtype} {list(features.shape)}, not [N, D]")
    if features.dtype not in (np.float16, np.float32):
        features = features.astype(np.float32)
    if coords.ndim != 2 or coords.shape[1:] != (2,) or not np.issubdtype(coords.dtype, np.number):
        raise SlideError(f"{path}: coords is {coords.dtype} {list(coords.shape)}, not [N, 2]")
    if len(coords) != len(features):
        raise SlideError(f"{path}: {len(features)} feature rows but {len(coords)} coords")
    bad = int(features.size - np.count_nonzero(np.isfinite(features)))
    if bad:
        raise SlideError(f"{path}: features have {bad} non-finite values (NaN or infinity)")
    return features, coords.astype(np.int64)


def _patch_level0(
    attrs: Mapping[str, Any], coord_attrs: Mapping[str, Any], coords: np.ndarray
) -> int:
    """The tile edge at level 0: as written, else CLAM's, else the grid step."""
    for source in (attrs, coord_attrs):
        if _positive(source.get("patch_size_level0")):
            return int(source["patch_size_level0"])
    if _positive(coord_attrs.get("patch_size")):
        down = np.asarray(coord_attrs.get("downsample", 1.0), np.float64).reshape(-1)[:1]
        return max(1, round(float(coord_attrs["patch_size"]) * float(down[0] if len(down) else 1)))
    steps = [np.diff(np.unique(coords[:, i])) for i in (0, 1)]
    steps = [int(s.min()) for s in steps if len(s)]
    return min(steps) if steps else 256


def _extent(
    attrs: Mapping[str, Any], coord_attrs: Mapping[str, Any], coords: np.ndarray, patch: int
) -> tuple[int, int]:
    for source in (attrs, coord_attrs):
        w, h = source.get("level0_width"), source.get("level0_height")
        if _positive(w) and _positive(h):
            return int(w), int(h)
    if not len(coords):
        return 0, 0
    top = coords.max(axis=0) + patch
    return int(top[0]), int(top[1])


def _positive(value: Any) -> bool:
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False


def _attr(value: Any) -> Any:
    """An HDF5 attribute as Python: bytes decoded, JSON text parsed, numpy scalars unwrapped."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return jsonsafe.loads(value, "an attribute")
        except ValueError:
            return value
    if isinstance(value, np.generic):
        return value.item()
    return value
