"""One slide through a served slide head: read its features, send, check, write, draw.

:func:`run_slide_head` is the one code path of ``histoserve aggregate`` and of
``histoserve embed --slide-model`` (which runs it over the feature files it
just wrote), so both give the same numbers. In order:

1. the features file read back and checked
   (:func:`~histoserve.results.sources.read_features`, its digest taken from
   the bytes parsed), the slide id it records compared with the id it is read
   under, its encoder and width with the head's (a :class:`SlideError` naming
   the file and both sides, before anything is sent; an empty slide too);
2. one request: ``features`` (FP32, or FP16 as stored) and ``coords``
   (INT64, unless ``send_coords`` is off); the answer checked
   (:func:`~histoserve.heads.head.head_check`, beside the client's own: retried
   elsewhere when wrong); a 4xx fails the slide with the server's message;
3. ``slide_features_<model>/<id>.h5`` (:mod:`~histoserve.heads.result_file`)
   and the slide's pictures as one unit: with ``qc``, the heatmap, the QuPath
   GeoJSON and the top tiles (:mod:`~histoserve.heads.pictures`) staged and
   renamed into place before the result is (a run killed in between leaves
   the old result, which resume runs again or redraws for); without ``qc``
   (or without attention) the slide's older pictures removed before it. So a
   result never sits beside pictures of another one; pictures that cannot be
   drawn leave none, said in the slide's status line, never a failed slide.

:func:`pictures_behind` and :func:`settle_pictures` are resume's half: a
done result whose pictures are missing or show another result (by the
digest they record) gets them redrawn from the result file, the head not
asked again; a run without ``qc`` removes such pictures.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from histoserve.errors import HistoserveError, SlideError
from histoserve.heads.head import HeadInfo, head_check
from histoserve.heads.pictures import (
    PictureFiles,
    picture_files,
    remove_pictures,
    shown_answer,
    write_pictures,
)
from histoserve.heads.result_file import (
    SlideAnswer,
    read_answer,
    result_attrs,
    result_path,
    write_result,
)
from histoserve.remote.client import HistoserveClient
from histoserve.results.sources import FeatureSource, SlideFeatures, read_features, tiling_of

logger = logging.getLogger("histoserve.aggregate")


@dataclass(frozen=True)
class HeadContext:
    """What every slide of a run shares.

    Attributes:
        info: The head as the server describes it.
        client: Sends its requests (retries, several URLs, every answer checked).
        out_dir: Where ``qc/`` goes (FEATURES_DIR, or embed's ``--out``).
        config_hash: The results' hash (:func:`~histoserve.heads.result_file.head_hash`).
        send_coords: Send ``coords`` with the features.
        qc: Write the heatmap and the QuPath GeoJSON.
        slides_dir: Where to look for the slides under the pictures (None: the recorded path).
    """

    info: HeadInfo
    client: HistoserveClient
    out_dir: Path
    config_hash: str
    send_coords: bool = True
    qc: bool = True
    slides_dir: Path | None = None

    def pictures(self, source: FeatureSource) -> PictureFiles:
        """Where ``source``'s pictures for this model go."""
        return picture_files(self.out_dir, source.slide_id, self.info.model, tiling_of(source.root))


def run_slide_head(ctx: HeadContext, source: FeatureSource) -> str:
    """Runs the head on ``source`` and writes its result and pictures (see the module docstring).

    Returns ``""``, or why the slide has no pictures (for its status line).

    Raises:
        SlideError: A bad features file, another width, the server refusing it
            (its message), retries used up: each naming the file.
    """
    sf = read_features(source.path, digest=True)  # the record is of the bytes sent
    if not len(sf.features):
        raise SlideError(f"{source.path}: no tiles (an empty slide): nothing to aggregate")
    check_identity(ctx.info, source, sf)
    check_fits(ctx.info, source.path, sf)
    info = ctx.info
    inputs = {"features": sf.features}
    if ctx.send_coords:
        inputs["coords"] = sf.coords
    try:
        raw = ctx.client.infer(inputs, mode=info.mode, check=head_check(info))
    except HistoserveError as exc:
        raise SlideError(f"{source.path}: {exc}") from exc
    answer = SlideAnswer(
        _float(raw.get("prediction")),
        _float(raw.get("attention")),
        _float(raw.get("slide_embedding")),
    )
    attrs = result_attrs(source, info, ctx.config_hash, sf.attrs)
    note = ""

    def pictures_first(digest: str) -> None:
        nonlocal note
        note = _pictures(ctx, source, sf, answer, digest)

    try:
        write_result(source, info, answer, sf.coords, attrs, sf.record or {}, pictures_first)
    except OSError as exc:
        raise SlideError(f"{source.path}: its slide result cannot be written ({exc})") from exc
    return note


def _pictures(
    ctx: HeadContext, source: FeatureSource, sf: SlideFeatures, answer: SlideAnswer, digest: str
) -> str:
    """The slide's pictures of the result ``digest``, or its older ones removed (without ``qc``)."""
    files = ctx.pictures(source)
    if not ctx.qc or answer.attention is None:
        remove_pictures(ctx.out_dir, *files.all())
        return ""
    return write_pictures(
        ctx.out_dir, files, ctx.info, sf, answer, digest, source.slide_id, ctx.slides_dir
    )


def remove_stale_temps(ctx: HeadContext, source: FeatureSource) -> None:
    """Removes what a killed run left half-written of the slide's result and pictures.

    Only under the slide's claim (no live process writes them then).

    Raises:
        SlideError: Their folder is unsafe (a symlink) or cannot be read.
    """
    from histoserve import atomic

    try:
        atomic.remove_stale_temps(result_path(source, ctx.info.model), root=source.root)
        for path in ctx.pictures(source).all():
            atomic.remove_stale_temps(path, root=ctx.out_dir)
    except OSError as exc:
        raise SlideError(
            f"{source.path}: its result or pictures cannot be written ({exc})"
        ) from exc


def pictures_behind(ctx: HeadContext, source: FeatureSource, attrs: Mapping[str, Any]) -> bool:
    """Whether a done result's pictures need :func:`settle_pictures`.

    Pictures there that are not all of the result ``attrs`` names (its
    ``answer_sha256``; a result from an older histoserve without it is
    digested from its datasets): a set torn by a killed run, or another
    result's. With ``qc``, also none there for a result with attention.
    """
    files = ctx.pictures(source)
    shown = shown_answer(files)
    result = result_path(source, ctx.info.model)
    if shown is None and not any(p.exists() for p in files.all()):  # none there
        read = read_answer(result) if ctx.qc else None
        return read is not None and read[0].attention is not None
    digest = attrs.get("answer_sha256")
    if not isinstance(digest, str):
        read = read_answer(result)
        digest = read[2] if read is not None else None
    return shown is None or shown != digest


def settle_pictures(ctx: HeadContext, source: FeatureSource) -> str:
    """Redraws a done result's pictures from its file (without ``qc``: removes them); what was done.

    Raises:
        SlideError: The result or the features file can no longer be read, or
            older pictures cannot be removed.
    """
    files = ctx.pictures(source)
    read = read_answer(result_path(source, ctx.info.model))
    if read is None:
        raise SlideError(f"{source.path}: its slide result cannot be read back")
    answer, _, digest = read
    try:
        if not ctx.qc or answer.attention is None:
            remove_pictures(ctx.out_dir, *files.all())
            return "pictures of another result removed"
        sf = read_features(source.path)
        note = write_pictures(
            ctx.out_dir, files, ctx.info, sf, answer, digest, source.slide_id, ctx.slides_dir
        )
    except OSError as exc:
        raise SlideError(
            f"{files.heatmap.parent}: older pictures cannot be removed ({exc})"
        ) from exc
    return note or "pictures redrawn from its result (missing or of another result)"


def check_identity(info: HeadInfo, source: FeatureSource, sf: SlideFeatures) -> None:
    """SlideError unless the file is the features of ``source``'s slide, from the head's encoder.

    The slide id the file records (``histoserve embed`` writes it; other tools'
    files may not) must be the id it is read under: a copied or renamed file
    is another slide's features. The encoder is compared by spec name when the
    head names its tile encoder and the file records the spec that made it
    (a digest the head does not know says nothing about the encoder).
    """
    named = sf.attrs.get("slide_id")
    if isinstance(named, str) and named and named != source.slide_id:
        raise SlideError(
            f"{source.path}: holds the features of slide {named!r}, not of "
            f"{source.slide_id!r} (a copied or renamed file): embed {source.slide_id!r} itself"
        )
    spec = sf.attrs.get("spec")
    made_by = spec.get("name") if isinstance(spec, Mapping) else None
    if info.encoder_name and isinstance(made_by, str) and made_by != info.encoder_name:
        raise SlideError(
            f"{source.path}: features made by tile encoder {made_by!r}, but {info.model!r} "
            f"takes the features of {info.encoder_name!r}"
        )


def check_fits(info: HeadInfo, path: Path, sf: SlideFeatures) -> None:
    """SlideError unless the head takes these features: their width, tile count and encoder.

    The encoder is compared by package digest, when the head names its tile
    encoder's and the features file records the package that made it.
    """
    width, n = sf.features.shape[1], len(sf.features)
    if info.feature_dim and width != info.feature_dim:
        raise SlideError(
            f"{path}: features are {width} wide but {info.model!r} takes "
            f"{info.feature_dim} (made by another tile encoder?)"
        )
    if info.max_tiles and n > info.max_tiles:
        raise SlideError(
            f"{path}: {n:,} tiles, more than the {info.max_tiles:,} {info.model!r} takes in "
            "one slide (the server's --max_tiles_per_slide)"
        )
    made_by = str(sf.attrs.get("package_sha256") or "")
    if info.encoder_sha256 and len(made_by) == 64 and made_by != info.encoder_sha256:
        raise SlideError(
            f"{path}: features made by package {made_by[:16]}..., but {info.model!r} takes "
            f"the features of package {info.encoder_sha256[:16]}... (another tile encoder)"
        )


def _float(values: Any) -> np.ndarray | None:
    return None if values is None else np.asarray(values, np.float32)
