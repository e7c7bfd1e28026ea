"""A slide head's answer for one slide, on disk beside the features it was made from.

``<root>/slide_features_<model>/<id>.h5``, where ``<root>`` is the folder of
the slide's features (TRIDENT's coords folder, else the features folder), as
TRIDENT names its slide features. Datasets: ``features`` (the slide
embedding ``[E]``, TRIDENT's name; absent when the head gave none),
``prediction`` ``[C]``, ``attention`` ``[N]`` or ``[N, C]`` (rows as the
features file's), ``coords`` ``[N, 2]``. Attributes: ``model``,
``package_sha256``, ``classes`` (JSON), ``slide_id``, ``tile_features`` (the
features file, relative to ``<root>``), ``tile_model`` and
``tile_package_sha256`` (from the features file), ``config_hash``, the
features file's digest and stat as the head's input was read
(:mod:`~histoserve.results.siblings`), ``answer_sha256`` (:func:`answer_sha256`
of its datasets: what the slide's pictures record of the result they show)
and ``complete`` (written last).

Written under a temp name and renamed (:func:`~histoserve.atomic.atomic_path`);
``before_replace`` runs once the file is whole, right before the rename, so
what derives from it (the pictures) is in place before the result is.
:func:`is_done` is resume: complete, the same ``config_hash`` (model,
package, mode), and made from the features file as it is now (its stat, else
its SHA-256): re-embedded features are aggregated again, and
:func:`made_from_current` keeps a stale result out of ``slides.csv``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from histoserve.atomic import atomic_path
from histoserve.heads.head import HeadInfo
from histoserve.results.output import config_hash, read_h5
from histoserve.results.siblings import record_of, sibling_problem
from histoserve.results.sources import FeatureSource

RESULTS_PREFIX = "slide_features_"
RESULT_VERSION = "slide-head-v1"
_DATASETS = ("features", "prediction", "attention", "coords")


def results_dir(root: Path, model: str) -> Path:
    """``<root>/slide_features_<model>``."""
    return Path(root) / f"{RESULTS_PREFIX}{model}"


def result_path(source: FeatureSource, model: str) -> Path:
    """Where ``source``'s slide result for ``model`` goes."""
    return results_dir(source.root, model) / f"{source.slide_id}.h5"


def head_hash(info: HeadInfo, send_coords: bool) -> str:
    """The config hash of a slide result: what shapes it besides the features file."""
    return config_hash(
        {
            "version": RESULT_VERSION,
            "model": info.model,
            "package_sha256": info.package_sha256,
            "mode": info.mode,
            "send_coords": send_coords,
        }
    )


@dataclass
class SlideAnswer:
    """A head's checked answer for one slide (float32 arrays; None where it gave none)."""

    prediction: np.ndarray | None
    attention: np.ndarray | None
    embedding: np.ndarray | None


def write_result(
    source: FeatureSource,
    info: HeadInfo,
    answer: SlideAnswer,
    coords: np.ndarray,
    attrs: Mapping[str, Any],
    features_read: Mapping[str, Any],
    before_replace: Callable[[str], None] | None = None,
) -> Path:
    """Writes the slide's result file; returns it.

    ``features_read`` is the features file's digest and stat as the head's
    input was read (``read_features(digest=True)``), never as it is now.
    ``before_replace(answer_sha256)`` is called with the file whole, before
    it is renamed into place; what it raises leaves the old result there.

    Raises:
        OSError: The folder cannot be written (or is a symlink: UnsafeFolder).
    """
    import h5py

    final = result_path(source, info.model)
    datasets = {
        "features": answer.embedding,
        "prediction": answer.prediction,
        "attention": answer.attention,
        "coords": np.asarray(coords, np.int64),
    }
    digest = answer_sha256(datasets)
    siblings = record_of(source.root, {source.path: features_read})
    hook = None if before_replace is None else lambda: before_replace(digest)
    with (
        atomic_path(final, root=source.root, before_replace=hook, lock=False) as tmp,
        h5py.File(tmp, "w") as f,
    ):
        for name, array in datasets.items():
            if array is not None:
                f.create_dataset(name, data=np.asarray(array))
        for key, value in {**attrs, **siblings, "answer_sha256": digest}.items():
            if value is not None:
                f.attrs[key] = _attr(value)
        f.attrs["complete"] = True
    return final


def answer_sha256(datasets: Mapping[str, np.ndarray | None]) -> str:
    """SHA-256 of a result's datasets (name, dtype, shape and bytes, by name; None left out).

    The same from the arrays written and from the file read back, so a
    result written by an older histoserve (no ``answer_sha256`` attribute)
    is digested from its datasets.
    """
    h = hashlib.sha256()
    for name in sorted(datasets):
        array = datasets[name]
        if array is None:
            continue
        array = np.ascontiguousarray(array)
        h.update(f"{name}|{array.dtype.str}|{list(array.shape)}|".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def result_attrs(
    source: FeatureSource, info: HeadInfo, chash: str, tile_attrs: Mapping[str, Any]
) -> dict[str, Any]:
    """The attributes of a slide result (see the module docstring)."""
    from histoserve import __version__

    return {
        "slide_id": source.slide_id,
        "model": info.model,
        "package_sha256": info.package_sha256,
        "classes": list(info.classes),
        "mode": info.mode,
        "tile_features": source.path.relative_to(source.root).as_posix(),
        "tile_model": tile_attrs.get("model") or tile_attrs.get("encoder"),
        "tile_package_sha256": tile_attrs.get("package_sha256"),
        "slide_path": tile_attrs.get("slide_path"),
        "config_hash": chash,
        "histoserve_version": __version__,
    }


def _attr(value: Any) -> Any:
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value) if isinstance(value, Path) else value


def is_done(source: FeatureSource, model: str, chash: str) -> bool:
    """Whether ``source`` has a complete result with ``chash`` made from its features as now."""
    return done_result(source, model, chash) is not None


def done_result(source: FeatureSource, model: str, chash: str) -> dict[str, Any] | None:
    """The attributes of ``source``'s result when :func:`is_done` holds, else None."""
    attrs = read_result_attrs(result_path(source, model))
    if attrs is None or attrs.get("config_hash") != chash:
        return None
    return None if sibling_problem(source.root, source.path, attrs) else attrs


def made_from_current(path: Path, attrs: Mapping[str, Any]) -> bool:
    """Whether the result at ``path`` was made from its features file as it is now.

    The features file is the result's ``tile_features`` under ``<root>`` (a
    relative path inside it; anything else is no current source): vanished,
    replaced or rewritten features make the result stale.
    """
    root = path.parent.parent
    name = attrs.get("tile_features")
    if not isinstance(name, str) or not name:
        return False
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        return False
    return not sibling_problem(root, root / relative, attrs)


def read_result_attrs(path: Path) -> dict[str, Any] | None:
    """A complete result file's attributes, else None (missing, unreadable, not complete)."""
    result = read_result(path)
    return None if result is None else result[0]


def read_result(path: Path) -> tuple[dict[str, Any], np.ndarray | None] | None:
    """A complete result file's attributes and prediction; None for any doubt."""

    def read(f: Any) -> tuple[dict[str, Any], np.ndarray | None]:
        attrs = {k: _text(v) for k, v in f.attrs.items()}
        return attrs, np.asarray(f["prediction"][()]) if "prediction" in f else None

    result = read_h5(path, read, (Exception,))  # h5py raises many kinds: any doubt is "not done"
    return result if result is not None and result[0].get("complete") else None


def read_answer(path: Path) -> tuple[SlideAnswer, np.ndarray, str] | None:
    """A complete result's answer, coords and :func:`answer_sha256` of them; None for any doubt."""

    def read(f: Any) -> tuple[SlideAnswer, np.ndarray, str] | None:
        if not f.attrs.get("complete") or "coords" not in f:
            return None
        got = {k: np.asarray(f[k][()]) if k in f else None for k in _DATASETS}
        answer = SlideAnswer(got["prediction"], got["attention"], got["features"])
        return answer, got["coords"], answer_sha256(got)

    return read_h5(path, read, (Exception,))


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value.item() if isinstance(value, np.generic) else value
