"""One slide's pictures of a slide head's answer, in ``qc/``.

- ``qc/<id>.<model>.heatmap.jpg`` (:mod:`~histoserve.heads.heatmap`),
  over the slide's thumbnail when the slide the features file was made from
  can be read and is that slide, else over a blank canvas at the tiles'
  extent with the reason in its title (:func:`verified_slide`: the slide is
  opened by the absolute path its recorded identity names, not by the path
  as ``embed`` was given it, and must have the recorded content digest and
  level-0 size: a heatmap is never drawn over another slide);
- ``qc/<id>.<model>.geojson`` (:mod:`~histoserve.heads.qupath`);
- ``qc/<id>.<model>.top.jpg``: the :data:`TOP_K` tiles of highest attention
  (the drawn branch) as crops, each read at the coarsest level that still
  gives :data:`CROP_PX` pixels, labelled with rank, percentile and level-0
  ``x, y`` (what CLAM users ask of its heatmap script: the coordinates of the
  top tiles); only when the slide can be read (the coordinates are in the
  GeoJSON and the result file all the same).

Each file is written whole under a temp name and renamed. Pictures are for
people: what fails here (an unreadable slide, a full disk) is a warning,
never a failed slide.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from histoserve.atomic import atomic_path
from histoserve.errors import SlideError
from histoserve.heads import heatmap, qupath
from histoserve.heads.head import HeadInfo
from histoserve.heads.results import SlideAnswer
from histoserve.results.sources import SlideFeatures

QC_DIR = "qc"
TOP_K = 8
CROP_PX = 224
_LABEL_PX = 34
logger = logging.getLogger("histoserve.aggregate")


def qc_paths(out_dir: Path, slide_id: str, model: str) -> tuple[Path, Path, Path]:
    """``qc/<id>.<model>.heatmap.jpg``, ``.geojson`` and ``.top.jpg``."""
    base = Path(out_dir) / QC_DIR / f"{slide_id}.{model}"
    return Path(f"{base}.heatmap.jpg"), Path(f"{base}.geojson"), Path(f"{base}.top.jpg")


def write_pictures(
    out_dir: Path, slide_id: str, info: HeadInfo, sf: SlideFeatures, answer: SlideAnswer
) -> None:
    """Writes the slide's pictures (see the module docstring); failures are warnings."""
    jpg, geojson, top = qc_paths(out_dir, slide_id, info.model)
    drawn, branch = heatmap.drawn_attention(answer.attention, answer.prediction)
    text = heatmap.prediction_text(answer.prediction, info.classes, branch)
    if len(drawn) > 1 and float(np.ptp(drawn)) == 0.0:
        text += " | every tile has the same attention"
    pct = heatmap.percentiles(drawn)
    try:
        with _slide(sf) as (reader, why_not):
            background, extent = _background(reader, sf)
            title = f"{slide_id}  |  {info.model}  |  {len(sf.coords)} tiles"
            if why_not:
                title += f"  |  slide not drawn: {why_not}"
            picture = heatmap.render_heatmap(
                background, extent, sf.coords, sf.patch_level0, drawn, title, text, _mpp(sf)
            )
            _save(out_dir, jpg, lambda p: picture.save(p, "JPEG", quality=90))
            if reader is not None:
                sheet = _top_sheet(reader, sf, drawn, pct, f"{slide_id}: most attended tiles")
                _save(out_dir, top, lambda p: sheet.save(p, "JPEG", quality=90))
        props = {"slide_id": slide_id, "model": info.model, "prediction": text}
        collection = qupath.detections(
            sf.coords, sf.patch_level0, answer.attention, pct, info.classes, props
        )
        _save(out_dir, geojson, lambda p: p.write_text(qupath.dumps(collection), encoding="utf-8"))
    except Exception as exc:  # pictures are for people: never a failed slide
        logger.warning("slide %s: pictures not written: %s", slide_id, exc)


def _save(out_dir: Path, path: Path, write: Any) -> None:
    with atomic_path(path, root=out_dir) as tmp:
        write(tmp)


def _mpp(sf: SlideFeatures) -> float | None:
    mpp = sf.attrs.get("level0_mpp")
    return float(mpp) if isinstance(mpp, int | float) and not isinstance(mpp, bool) else None


def verified_slide(sf: SlideFeatures) -> tuple[Path | None, str]:
    """The slide the features were made from, or None and why not (``""``: none recorded).

    The features file records the slide's identity (its resolved absolute path,
    size and sampled digest, :mod:`~histoserve.slides.identity`) and level-0
    size. The slide at that path must still have that content; a path that
    was relative where ``embed`` ran names another file elsewhere, and a file
    moved since is not found (the blank canvas says so).
    """
    from histoserve.slides.identity import IDENTITY_ATTR, SlideIdentity, slide_identity

    raw = sf.attrs.get(IDENTITY_ATTR)
    recorded = SlideIdentity.from_attr(json.dumps(raw) if isinstance(raw, dict) else raw)
    if recorded is None:
        return None, "" if sf.slide_path is None else "the features record no slide identity"
    path = Path(recorded.path)
    try:
        current = slide_identity(path)
    except SlideError:
        return None, f"{path.name} is not there any more"
    if current.size != recorded.size or current.digest != recorded.digest:
        return None, f"{path.name} is not the slide the features were made from"
    return path, ""


@contextlib.contextmanager
def _slide(sf: SlideFeatures) -> Iterator[tuple[Any, str]]:
    """The verified slide, open, and ``""``; or None and why it is not drawn."""
    path, why_not = verified_slide(sf)
    reader = None
    if path is not None:
        try:
            from histoserve.slides.readers import SlideReader

            reader = SlideReader.open(path)
        except Exception as exc:  # pictures only: a blank canvas instead
            why_not = f"{path.name} cannot be read ({type(exc).__name__})"
    if reader is not None and not _same_size(reader, sf):
        why_not = (
            f"{path} is {reader.dimensions[0]}x{reader.dimensions[1]} px, not the size recorded"
        )
        reader.close()
        reader = None
    if why_not:
        slide_id = sf.attrs.get("slide_id")
        logger.warning("slide %s: heatmap drawn without its slide: %s", slide_id, why_not)
    try:
        yield reader, why_not
    finally:
        if reader is not None:
            reader.close()


def _same_size(reader: Any, sf: SlideFeatures) -> bool:
    """Whether the open slide's level 0 is the size the features file records (when it does)."""
    w, h = sf.attrs.get("level0_width"), sf.attrs.get("level0_height")
    if not isinstance(w, int) or not isinstance(h, int):
        return True
    return tuple(int(v) for v in reader.dimensions) == (w, h)


def _background(reader: Any, sf: SlideFeatures) -> tuple[np.ndarray | None, tuple[int, int]]:
    """The slide's thumbnail and level-0 extent, else None and the tiles' extent."""
    if reader is None:
        return None, sf.extent
    try:
        from histoserve.slides.readers import MppInfo
        from histoserve.tissue.detect import thumbnail

        width, height = reader.dimensions
        unit = MppInfo(1.0, "level-0 px")  # thumbnail scale in level-0 px per px
        rgb, _ = thumbnail(reader, unit, max(width, height) / heatmap.DISPLAY_PX)
        return rgb, (int(width), int(height))
    except Exception as exc:  # pictures only: a blank canvas instead
        logger.info("no thumbnail under the heatmap (%s)", exc)
        return None, sf.extent


def _top_sheet(
    reader: Any, sf: SlideFeatures, drawn: np.ndarray, pct: np.ndarray, title: str
) -> Any:
    """The most attended tiles read from the slide, labelled."""
    pictures, labels = [], []
    for rank, i in enumerate(top_tiles(drawn), start=1):
        x, y = (int(v) for v in sf.coords[i])
        pictures.append(read_crop(reader, (x, y), sf.patch_level0))
        labels.append(f"#{rank}  {100 * float(pct[i]):.1f} pct\nx {x}, y {y}")
    return contact_sheet(pictures, labels, title)


def top_tiles(values: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """Indices of the ``k`` highest values, highest first (ties: the earlier row first)."""
    order = np.argsort(-np.asarray(values, np.float64), kind="stable")
    return order[:k]


def read_crop(reader: object, xy: tuple[int, int], patch: int) -> Image.Image:
    """One tile's level-0 footprint, read at the coarsest level still fine enough, as CROP_PX px."""
    downsamples = list(reader.level_downsamples)  # type: ignore[attr-defined]
    fine = [i for i, d in enumerate(downsamples) if patch / d >= CROP_PX] or [0]
    level = max(fine, key=lambda i: downsamples[i])
    size = max(1, round(patch / downsamples[level]))
    region = reader.read_region((int(xy[0]), int(xy[1])), level, (size, size))  # type: ignore[attr-defined]
    return Image.fromarray(np.asarray(region, np.uint8)).resize(
        (CROP_PX, CROP_PX), Image.Resampling.LANCZOS
    )


def contact_sheet(crops: list[Image.Image], labels: list[str], title: str) -> Image.Image:
    """The crops in one row, each with its label under it, a title above."""
    font = ImageFont.load_default(size=14)
    width = max(1, len(crops)) * (CROP_PX + 8) + 8
    out = Image.new("RGB", (width, CROP_PX + _LABEL_PX + 40), (255, 255, 255))
    draw = ImageDraw.Draw(out)
    draw.text((8, 8), title, fill=(0, 0, 0), font=ImageFont.load_default(size=16))
    for i, (crop, label) in enumerate(zip(crops, labels, strict=True)):
        x = 8 + i * (CROP_PX + 8)
        out.paste(crop, (x, 34))
        draw.multiline_text((x, 36 + CROP_PX), label, fill=(0, 0, 0), font=font, spacing=2)
    return out
