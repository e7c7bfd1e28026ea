"""Where a slide's output goes and in what form: ``flat``, ``trident`` or ``clam``.

- ``flat`` (the default): ``<out>/<slide_id>.h5`` as :mod:`~histoserve.results.output`
  writes it.
- ``trident``: TRIDENT's job folder. ``<out>/<mag>x_<size>px_0px_overlap/patches/
  <slide_id>_patches.h5`` (``coords`` int64 ``[N, 2]`` with TRIDENT's
  ``coords_to_h5`` attributes: ``patch_size`` the tile edge at the target
  magnification, ``patch_size_level0``, ``level0_magnification``,
  ``target_magnification``, ``overlap``, ``name``, ``savetodir``,
  ``level0_width``, ``level0_height``) and ``.../features_<encoder>/<slide_id>.h5``
  (``features`` float32 ``[N, D]`` with ``name``, ``savetodir``, ``encoder``;
  ``coords`` as above). Magnifications follow TRIDENT's mpp bins (0.25 um/px
  is 40x, 0.5 is 20x); the encoder is TRIDENT's name for the model
  (:func:`trident_encoder`).
- ``clam``: ``<out>/h5_files/<slide_id>.h5`` (``features`` float32 ``[N, D]``,
  ``coords`` int64 ``[N, 2]`` level-0 with CLAM's patch attributes:
  ``patch_size`` and ``patch_level`` are the area actually read, i.e.
  ``read_size`` px at ``read_level``, plus ``downsample``, ``level_dim``,
  ``downsampled_level_dim``, ``name``, ``save_path``) and
  ``<out>/pt_files/<slide_id>.pt`` (``torch.save`` of the float32 features
  tensor). torch is imported only when a ``clam`` file is written.

Every file is written under a hidden temporary name and renamed into place;
the file that says "done" (the flat file, TRIDENT's features file, CLAM's
``h5_files`` file) is renamed last and carries ``complete``, ``config_hash``
and the slide's identity (``slide_identity``,
:mod:`~histoserve.slides.identity`) as file attributes, so resume,
claims and shards behave the same in every layout. A run's check that the
slide is unchanged (``before_commit``) runs right before that last rename: a
slide changed meanwhile never gets a done file. Two files are two renames:
the done file also records the other one (:mod:`~histoserve.results.siblings`),
and :meth:`Layout.check_done` checks it, so a pair torn by a run killed
between its renames (one run's coordinates or ``.pt`` beside another run's
done file) is never done: the slide is embedded again. An empty slide has
``features`` of shape ``(0, D)``.

No folder inside ``--out`` is written through a symlink: :meth:`Layout.check_folders`
refuses one before the run (UsageError), and every write, unlink and temp
clean-up reaches its folder without following one
(:func:`~histoserve.atomic.open_folder`; one planted during the
run fails that slide).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from histoserve.atomic import (
    UnsafeFolder,
    atomic_path,
    check_folders,
    remove_stale_temps,
)
from histoserve.errors import SlideError, UsageError
from histoserve.results import output
from histoserve.results.siblings import sibling_problem, sibling_record
from histoserve.slides.identity import IDENTITY_ATTR, SlideIdentity, identity_change

LAYOUTS = ("flat", "trident", "clam")
# TRIDENT's compound extensions (trident/IO.py): x.ome.tiff is slide "x" there.
_COMPOUND_SUFFIXES = (".ome.tif", ".ome.tiff", ".ome.zarr")
# TRIDENT's encoder names (trident/patch_encoder_models/load.py) by normalised model name.
_TRIDENT_ENCODERS = {"hoptimus0": "hoptimus0", "hoptimus1": "hoptimus1", "h0mini": "h0-mini"}
# TRIDENT's level-0 magnification bins (WSI._fetch_magnification): mpp upper bound -> mag.
_MAG_BINS = ((0.16, 80), (0.2, 60), (0.3, 40), (0.6, 20), (1.2, 10), (2.4, 5))
_Hook = Callable[[], None] | None  # a layout's before_commit: called before the last rename


def slide_id_from_path(path: str | Path, layout: str) -> str:
    """A slide id as the layout's tool derives it from a file or folder name.

    ``flat`` and ``clam`` drop the last suffix (``os.path.splitext``, CLAM's
    rule: ``x.ome.tiff`` -> ``x.ome``); ``trident`` also drops TRIDENT's compound
    suffixes ``.ome.tif``, ``.ome.tiff``, ``.ome.zarr`` (``x.ome.tiff`` -> ``x``).
    """
    name = Path(path).name
    if layout == "trident":
        for suffix in _COMPOUND_SUFFIXES:
            if name.lower().endswith(suffix):
                return name[: -len(suffix)]
    return Path(name).stem


def trident_encoder(model: str) -> str:
    """TRIDENT's encoder name for a served model (``h-optimus-0`` -> ``hoptimus0``).

    H-optimus-0, H-optimus-1 and H0-mini, in any case and with any dashes or
    underscores, get TRIDENT's spelling; other models keep their served name.
    """
    key = "".join(ch for ch in model.lower() if ch.isalnum())
    return _TRIDENT_ENCODERS.get(key, model)


def trident_magnification(mpp: float) -> float:
    """TRIDENT's magnification for an mpp: its level-0 bins, ``10 / mpp`` beyond them."""
    for upper, mag in _MAG_BINS:
        if mpp < upper:
            return float(mag)
    return 10.0 / mpp


def _mag_text(mag: float) -> str:
    return str(round(mag)) if abs(mag - round(mag)) < 1e-9 else f"{mag:g}"


@dataclass(frozen=True)
class DoneCheck:
    """A resume check's answer.

    Attributes:
        done: The slide is done: skip it.
        reason: Why a done file that is there was not trusted (the slide
            changed, a torn pair, an older histoserve's file), for the status
            line; ``""`` when there is none or its settings differ.
    """

    done: bool
    reason: str = ""


@dataclass(frozen=True)
class Layout:
    """One run's output layout.

    Attributes:
        name: ``flat``, ``trident`` or ``clam``.
        out_dir: The run's output folder (TRIDENT's job folder).
        target_mpp: Tile mpp (names TRIDENT's coords folder).
        tile_size: Tile edge (px) at the target mpp.
        model: Served model name (TRIDENT's encoder name is derived from it).
        embedding_dim: ``D`` of an empty slide's ``(0, D)`` features.
        overlap: Pixels neighbouring tiles share (names TRIDENT's coords folder).
    """

    name: str
    out_dir: Path
    target_mpp: float
    tile_size: int
    model: str
    embedding_dim: int = 0
    overlap: int = 0

    def __post_init__(self) -> None:
        if self.name not in LAYOUTS:
            raise UsageError(f"--layout {self.name!r}: must be one of {', '.join(LAYOUTS)}")
        if not 0 <= self.overlap < self.tile_size:
            raise UsageError(
                f"--overlap {self.overlap}: must be less than the tile size, {self.tile_size} px"
            )
        object.__setattr__(self, "out_dir", Path(self.out_dir))

    @property
    def coords_dir(self) -> Path:
        """TRIDENT's ``<mag>x_<size>px_<overlap>px_overlap`` folder."""
        mag = _mag_text(10.0 / self.target_mpp)
        return self.out_dir / f"{mag}x_{self.tile_size}px_{self.overlap}px_overlap"

    def done_file(self, slide_id: str) -> Path:
        """The file renamed into place last: it holds ``complete`` and ``config_hash``."""
        if self.name == "trident":
            return self.coords_dir / f"features_{trident_encoder(self.model)}" / f"{slide_id}.h5"
        if self.name == "clam":
            return self.out_dir / "h5_files" / f"{slide_id}.h5"
        return output.final_path(self.out_dir, slide_id)

    def files(self, slide_id: str) -> tuple[Path, ...]:
        """Every file a finished slide has, the done file last."""
        if self.name == "trident":
            patches = self.coords_dir / "patches" / f"{slide_id}_patches.h5"
            return patches, self.done_file(slide_id)
        if self.name == "clam":
            return self.out_dir / "pt_files" / f"{slide_id}.pt", self.done_file(slide_id)
        return (self.done_file(slide_id),)

    def check_folders(self, *extra: str) -> None:
        """UsageError when a folder the run writes in inside ``out_dir`` is a symlink or no folder.

        The layout's folders, ``incomplete`` and ``extra`` (``qc``); ``out_dir``
        itself may be a symlink.
        """
        folders = {p.parent for p in self.files("_")} | {output.incomplete_dir(self.out_dir)}
        try:
            check_folders(self.out_dir, sorted(folders | {self.out_dir / e for e in extra}))
        except UnsafeFolder as exc:
            raise UsageError(str(exc)) from exc

    def remove_stale_temps(self, slide_id: str) -> None:
        """Removes temp files of the slide's files left by killed runs (hold its claim).

        Raises:
            SlideError: One of its folders became a symlink.
        """
        incomplete = output.incomplete_dir(self.out_dir) / f"{slide_id}.h5"
        with _per_slide():
            for path in (*self.files(slide_id), incomplete):
                remove_stale_temps(path, root=self.out_dir)

    def discard_incomplete(self, slide_id: str) -> None:
        """Removes an earlier ``incomplete/<id>.h5`` (SlideError: ``incomplete`` is a symlink)."""
        with _per_slide():
            output.discard_incomplete(self.out_dir, slide_id)

    def check_done(
        self, slide_id: str, config_hash: str, identity: SlideIdentity, max_bad_tiles: int = 0
    ) -> DoneCheck:
        """Whether the slide is done: complete with the hash, from this slide, its files whole.

        Done when the done file is complete with ``config_hash`` (and at most
        ``max_bad_tiles`` accepted unreadable tiles, ``--accept-bad-tiles``),
        was made from a slide with the content of ``identity``
        (:func:`~histoserve.slides.identity.identity_change`), and every
        other file of the slide is the one the done file recorded
        (:func:`~histoserve.results.siblings.sibling_problem`).

        Raises:
            SlideError: The file there holds another slide id (``output.check_holder``).
        """
        done_file = self.done_file(slide_id)
        output.check_holder(done_file, slide_id)
        attrs = output.done_attrs(done_file, config_hash, max_bad_tiles)
        if attrs is None:
            return DoneCheck(False)
        recorded = SlideIdentity.from_attr(attrs.get(IDENTITY_ATTR))
        change = identity_change(recorded, identity)
        if change:
            return DoneCheck(False, change)
        return DoneCheck(False, torn) if (torn := self._torn(slide_id, attrs)) else DoneCheck(True)

    def is_done(
        self, slide_id: str, config_hash: str, identity: SlideIdentity, max_bad_tiles: int = 0
    ) -> bool:
        """:meth:`check_done`'s answer alone."""
        return self.check_done(slide_id, config_hash, identity, max_bad_tiles).done

    def _torn(self, slide_id: str, attrs: Mapping[str, Any]) -> str:
        """Why the slide's other files are not the ones its done file recorded (``""``: they are)."""
        for path in self.files(slide_id)[:-1]:
            if problem := sibling_problem(self.out_dir, path, attrs):
                return problem
        return ""

    def write(self, slide_id: str, result: output.SlideResult, before_commit: _Hook = None) -> Path:
        """Writes the slide's files (the done file last); returns the done file.

        ``before_commit`` is called right before the done file's rename; what
        it raises leaves no done file (the slide is not done).

        Raises:
            ValueError: Arrays of different lengths.
            SlideError: A folder of the slide's files is a symlink.
            OSError: A folder cannot be written.
        """
        result = _with_dim(result, self.embedding_dim)
        if self.name != "flat" and result.features is None:
            raise UsageError(f"--layout {self.name} needs features: use an embedding mode")
        with _per_slide():
            if self.name == "flat":
                return output.write_slide(
                    self.out_dir, slide_id, result, root=self.out_dir, before_commit=before_commit
                )
            if self.name == "trident":
                return self._write_trident(slide_id, result, before_commit)
            return self._write_clam(slide_id, result, before_commit)

    def write_incomplete(
        self, slide_id: str, result: output.SlideResult, before_commit: _Hook = None
    ) -> Path:
        """Writes ``incomplete/<id>.h5`` (``complete=False``), as :meth:`write` its done file."""
        folder, root = output.incomplete_dir(self.out_dir), self.out_dir
        with _per_slide():
            return output.write_slide(
                folder, slide_id, result, complete=False, root=root, before_commit=before_commit
            )

    def _write_trident(
        self, slide_id: str, result: output.SlideResult, before_commit: _Hook
    ) -> Path:
        patches, final = self.files(slide_id)
        coords_attrs = self._trident_coords_attrs(slide_id, result.attrs)
        _write_h5(patches, {"coords": result.coords}, {"coords": coords_attrs}, {}, self.out_dir)
        siblings = sibling_record(self.out_dir, patches)
        feature_attrs = {
            "name": slide_id,
            "savetodir": str(final.parent),
            "encoder": trident_encoder(self.model),
        }
        datasets = output.checked_arrays(result)
        attrs = {"features": feature_attrs, "coords": coords_attrs}
        file_attrs = {**output.file_attrs(result.attrs), **siblings}
        return _write_h5(final, datasets, attrs, file_attrs, self.out_dir, before_commit)

    def _trident_coords_attrs(self, slide_id: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
        level0 = trident_magnification(float(attrs["level0_mpp"]))
        target = 10.0 / self.target_mpp
        return {
            "patch_size": int(self.tile_size),
            "patch_size_level0": int(attrs["patch_size_level0"]),
            "level0_magnification": int(level0) if level0.is_integer() else level0,
            "target_magnification": int(target) if target.is_integer() else target,
            "overlap": self.overlap,
            "name": slide_id,
            "savetodir": str(self.coords_dir),
            "level0_width": int(attrs["level0_width"]),
            "level0_height": int(attrs["level0_height"]),
        }

    def _write_clam(self, slide_id: str, result: output.SlideResult, before_commit: _Hook) -> Path:
        pt_file, final = self.files(slide_id)
        _write_pt(pt_file, np.asarray(result.features, np.float32), self.out_dir)
        siblings = sibling_record(self.out_dir, pt_file)
        coords_attrs = clam_coords_attrs(slide_id, result.attrs, self.out_dir)
        datasets = output.checked_arrays(result)
        file_attrs = {**output.file_attrs(result.attrs), **siblings}
        attrs = {"coords": coords_attrs}
        return _write_h5(final, datasets, attrs, file_attrs, self.out_dir, before_commit)


@contextlib.contextmanager
def _per_slide() -> Iterator[None]:
    """A folder swapped for a symlink during the run fails the slide writing there."""
    try:
        yield
    except UnsafeFolder as exc:
        raise SlideError(str(exc)) from exc


def clam_coords_attrs(slide_id: str, attrs: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """CLAM's ``coords`` attributes (``create_patches_fp.py``) for the area actually read.

    ``patch_size`` is the edge read at ``patch_level`` (``read_size``), not the
    model's tile size; ``custom_downsample`` (read by TRIDENT's legacy reader)
    is ``read_size / tile_size`` when that is a whole number.
    """
    d = float(attrs["read_downsample"])
    dims = np.array([attrs["read_level_width"], attrs["read_level_height"]], np.int64)
    out: dict[str, Any] = {
        "patch_size": int(attrs["read_size"]),
        "patch_level": int(attrs["read_level"]),
        "downsample": np.array([d, d]),
        "downsampled_level_dim": dims,
        "level_dim": dims,
        "name": slide_id,
        "save_path": str(out_dir / "h5_files"),
    }
    ratio = int(attrs["read_size"]) / int(attrs["tile_size"])
    if ratio.is_integer():
        out["custom_downsample"] = int(ratio)
    return out


def _with_dim(result: output.SlideResult, dim: int) -> output.SlideResult:
    """``(0, 0)`` features of an empty slide become ``(0, D)``."""
    features = result.features
    if features is None or len(features) or not dim or features.shape[1:] == (dim,):
        return result
    return output.SlideResult(
        np.zeros((0, dim), np.float32),
        result.predictions,
        result.coords,
        result.tissue_fraction,
        result.attrs,
    )


def _write_h5(
    final: Path,
    datasets: Mapping[str, np.ndarray],
    dataset_attrs: Mapping[str, Mapping[str, Any]],
    file_attrs: Mapping[str, Any],
    root: Path,
    before_commit: _Hook = None,
) -> Path:
    import h5py

    commit = atomic_path(final, root=root, before_replace=before_commit, lock=False)
    with commit as tmp, h5py.File(tmp, "w") as f:
        for name, array in datasets.items():
            f.create_dataset(name, data=array)
            for key, value in dataset_attrs.get(name, {}).items():
                f[name].attrs[key] = value
        for key, value in file_attrs.items():
            f.attrs[key] = value
        if file_attrs:
            f.attrs[output.COMPLETE_ATTR] = True
    return final


def _write_pt(final: Path, features: np.ndarray, root: Path) -> Path:
    import torch  # only the clam layout needs it

    with atomic_path(final, root=root) as tmp:
        torch.save(torch.from_numpy(np.ascontiguousarray(features)), tmp)
    return final
