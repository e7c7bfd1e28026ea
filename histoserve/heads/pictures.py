"""One slide's pictures of a head's answer in ``qc/``: their names, what they record, one unit.

Names (:func:`picture_files`): ``qc/<id>.<model>.heatmap.jpg``, ``.top.jpg``
and ``.geojson``; for a TRIDENT job folder the coords folder the features
come from is in the name too (``qc/<id>.<model>.20x_224px_0px_overlap.heatmap.jpg``,
:func:`~histoserve.results.sources.tiling_of`), so runs of another
magnification, tile size or overlap into one folder keep their own pictures.

Each picture records the :func:`~histoserve.heads.result_file.answer_sha256` of
the result it shows: the JPEGs in their comment (``histoserve
answer_sha256=<hex>``), the GeoJSON as its collection's ``answer_sha256``
property. The heatmap is renamed into place after the others (and the result
after it), so it speaks for the set: :func:`shown_answer` reads its comment
(the JPEG header only, no pixels) and resume compares it with the result's.
The pictures:

- the heatmap (:mod:`~histoserve.heads.heatmap`), over the slide's thumbnail
  when the slide the features were made from is found and verified
  (:mod:`~histoserve.heads.background`; ``aggregate --slides DIR`` looks
  there), else over a blank canvas at the tiles' extent with the reason in
  its title: a heatmap is never drawn over another slide;
- the QuPath GeoJSON (:mod:`~histoserve.heads.qupath`);
- the top tiles: the :data:`TOP_K` tiles of highest attention (the drawn
  branch) as crops, each read at the coarsest level that still gives
  :data:`CROP_PX` pixels, labelled with rank, percentile and level-0 ``x, y``
  (what CLAM users ask of its heatmap script); only when the slide is
  verified (the coordinates are in the GeoJSON and the result file all the same).

:func:`write_pictures` is all or nothing: the heatmap of this result is
removed first, every picture is staged under a temp name, then the GeoJSON,
the top tiles and the heatmap are renamed into place, the heatmap last (the
result itself after them: :func:`~histoserve.heads.result_file.write_result`'s
``before_replace``). A top-tiles sheet not drawn this time (the slide not
verified) is removed, never left from an earlier run. What fails while
drawing (a full disk, an unreadable region) leaves none of the slide's
pictures, and the reason is returned for the slide's status line: pictures
are for people, a slide never fails for them.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from histoserve.atomic import atomic_path, open_folder, open_regular
from histoserve.heads import heatmap, qupath
from histoserve.heads.background import background, open_slide
from histoserve.heads.head import HeadInfo
from histoserve.heads.result_file import SlideAnswer
from histoserve.results.sources import SlideFeatures

QC_DIR = "qc"
COMMENT_PREFIX = "histoserve answer_sha256="
TOP_K = 8
CROP_PX = 224
_LABEL_PX = 34
logger = logging.getLogger("histoserve.aggregate")


@dataclass(frozen=True)
class PictureFiles:
    """The paths of one slide's pictures for one model (see the module docstring)."""

    heatmap: Path
    top: Path
    geojson: Path

    def all(self) -> tuple[Path, Path, Path]:
        """The three, the heatmap first (it goes first and comes back last)."""
        return self.heatmap, self.top, self.geojson


def picture_base(slide_id: str, model: str, tiling: str = "") -> str:
    """``<id>.<model>`` (``.<tiling>`` added when there is one): the pictures' shared name."""
    return f"{slide_id}.{model}" + (f".{tiling}" if tiling else "")


def picture_files(out_dir: Path, slide_id: str, model: str, tiling: str = "") -> PictureFiles:
    """Where the slide's pictures go under ``out_dir/qc``."""
    base = Path(out_dir) / QC_DIR / picture_base(slide_id, model, tiling)
    return PictureFiles(
        Path(f"{base}.heatmap.jpg"), Path(f"{base}.top.jpg"), Path(f"{base}.geojson")
    )


def jpeg_comment(digest: str) -> bytes:
    """What a JPEG picture records of the result it shows."""
    return f"{COMMENT_PREFIX}{digest}".encode("ascii")


def recorded_answer(path: Path) -> str | None:
    """The result digest the JPEG at ``path`` records; None when missing, unreadable or none."""
    try:
        with open(open_regular(path), "rb") as handle, Image.open(handle) as picture:
            comment = picture.info.get("comment")
    except Exception:  # PIL raises many kinds: any doubt is "no record"
        return None
    text = comment.decode("ascii", "replace") if isinstance(comment, bytes) else ""
    return text[len(COMMENT_PREFIX) :] if text.startswith(COMMENT_PREFIX) else None


def shown_answer(files: PictureFiles) -> str | None:
    """The digest of the result the slide's pictures show; None when they are not all there."""
    if not files.geojson.is_file():
        return None
    return recorded_answer(files.heatmap)


def remove_pictures(out_dir: Path, *paths: Path) -> bool:
    """Removes these pictures (in this order: a set's heatmap first); whether there were any.

    Raises:
        OSError: One cannot be removed (``qc/`` a symlink: UnsafeFolder).
    """
    removed = False
    if not paths:
        return False
    with open_folder(Path(out_dir), paths[0].parent, create=False) as fd:
        if fd is None:
            return False
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.name, dir_fd=fd)
                removed = True
    return removed


def write_pictures(
    out_dir: Path,
    files: PictureFiles,
    info: HeadInfo,
    sf: SlideFeatures,
    answer: SlideAnswer,
    digest: str,
    slide_id: str,
    slides_dir: Path | None = None,
) -> str:
    """Writes the slide's pictures of the result ``digest`` (see the module docstring).

    Returns ``""``, or why the slide has no pictures now (its older ones removed).

    Raises:
        OSError: An older picture cannot be removed (it would outlive its result).
    """
    remove_pictures(out_dir, files.heatmap)
    try:
        with contextlib.ExitStack() as stack:
            _draw(stack, out_dir, files, info, sf, answer, digest, slides_dir, slide_id)
        return ""  # renamed: the GeoJSON, the top tiles, then the heatmap
    except Exception as exc:  # pictures are for people: never a failed slide
        logger.warning("slide %s: pictures not written: %s", slide_id, exc)
        remove_pictures(out_dir, *files.all())
        return f"no pictures: {type(exc).__name__}: {exc}"


def _draw(
    stack: contextlib.ExitStack,
    out_dir: Path,
    files: PictureFiles,
    info: HeadInfo,
    sf: SlideFeatures,
    answer: SlideAnswer,
    digest: str,
    slides_dir: Path | None,
    slide_id: str,
) -> None:
    """Stages every picture in ``stack`` (renamed when it closes: last entered, first renamed)."""

    def staged(path: Path) -> Path:
        return stack.enter_context(atomic_path(path, root=out_dir))

    comment = jpeg_comment(digest)
    drawn, branch = heatmap.drawn_attention(answer.attention, answer.prediction)
    text = heatmap.prediction_text(answer.prediction, info.classes, branch)
    if len(drawn) > 1 and float(np.ptp(drawn)) == 0.0:
        text += " | every tile has the same attention"
    pct = heatmap.percentiles(drawn)
    reader, why_not = stack.enter_context(open_slide(sf, slide_id, slides_dir))
    thumb, extent = background(reader, sf)
    title = f"{slide_id}  |  {info.model}  |  {len(sf.coords)} tiles"
    if why_not:
        title += f"  |  slide not drawn: {why_not}"
    picture = heatmap.render_heatmap(
        thumb, extent, sf.coords, sf.patch_level0, drawn, title, text, _mpp(sf)
    )
    picture.save(staged(files.heatmap), "JPEG", quality=90, comment=comment)
    if reader is not None:
        sheet = _top_sheet(reader, sf, drawn, pct, f"{slide_id}: most attended tiles")
        sheet.save(staged(files.top), "JPEG", quality=90, comment=comment)
    else:
        stack.callback(remove_pictures, out_dir, files.top)  # an older one; before the heatmap
    props = {"slide_id": slide_id, "model": info.model, "prediction": text}
    props["answer_sha256"] = digest
    collection = qupath.detections(
        sf.coords, sf.patch_level0, answer.attention, pct, info.classes, props
    )
    staged(files.geojson).write_text(qupath.dumps(collection), encoding="utf-8")


def _mpp(sf: SlideFeatures) -> float | None:
    mpp = sf.attrs.get("level0_mpp")
    return float(mpp) if isinstance(mpp, int | float) and not isinstance(mpp, bool) else None


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
