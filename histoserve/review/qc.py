"""Per-slide QC files: what a person checks before trusting a slide's features.

For every slide that gets as far as its tile plan, ``<out>/qc/`` holds

- ``<id>.jpg``: the slide's thumbnail with the tissue contours (green), the
  kept tile grid (blue) and any unreadable tiles (red) drawn on it, and a
  caption with the tile count, mpp and its source, level and resize;
- ``<id>.geojson``: the tissue contours as QuPath opens and edits them (a
  FeatureCollection of annotation Polygons in level-0 pixels, classified
  ``Tissue``); edited and given back with ``--masks`` or the manifest's
  ``mask`` column, it decides the tiles of the next run;
- ``<id>.json``: the facts the run report (:mod:`~histoserve.review.report`)
  lists: mpp and its source, level, resize, tissue area, tiles planned,
  kept and unreadable.

Files are written whole under a temporary name and renamed, so a report
built meanwhile never reads half a file; ``qc`` must be a real folder, not a
symlink (:func:`~histoserve.atomic.open_folder`). Reading them
back (:func:`read_facts`) takes regular files only (never blocking on a
FIFO) whose facts have the types the report needs; any other is left out
with one warning naming it.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from histoserve import jsonsafe
from histoserve.atomic import atomic_path, open_folder, read_regular
from histoserve.slides.grid import TilePlan
from histoserve.tissue.masks import TissueMap, feature_collection

QC_DIR = "qc"
DISPLAY_PX = 1200  # longest side of the QC picture
MAX_UPSCALE = 6.0
CONTOUR = (0, 200, 0, 255)
TILE = (30, 90, 255, 210)
BAD = (230, 20, 20, 255)
BAD_FILL = (230, 20, 20, 90)
CAPTION_PX = 18
FACTS_MAX_BYTES = 1 << 20  # a facts file is about 1 KB
# The facts the report reads, and their JSON types (numbers: finite, never a bool).
_FACT_TYPES = {
    "slide_id": str, "level0_mpp": float, "mpp_source": str, "tile_size": int,
    "read_level": int, "read_size": int, "resized": bool, "tissue_area_mm2": float,
    "n_kept": int, "n_bad": int,
}  # fmt: skip
logger = logging.getLogger("histoserve.embed")


def qc_dir(out_dir: Path) -> Path:
    """``<out>/qc``."""
    return Path(out_dir) / QC_DIR


def slide_facts(
    slide_id: str, plan: TilePlan, tissue: TissueMap, kept: np.ndarray, bad: np.ndarray
) -> dict[str, Any]:
    """What the report lists for one slide (JSON-ready)."""
    return {
        "slide_id": slide_id,
        "level0_mpp": plan.level0_mpp,
        "mpp_source": plan.mpp_source,
        "target_mpp": plan.target_mpp,
        "tile_size": plan.tile_size,
        "read_level": plan.read_level,
        "read_size": plan.read_size,
        "resized": plan.resized,
        "patch_size_level0": plan.patch_size_level0,
        "level0_width": plan.level0_width,
        "level0_height": plan.level0_height,
        "tissue": tissue.source,
        "tissue_area_mm2": round(tissue.area_mm2, 4),
        "n_planned": len(plan.coords),
        "n_kept": len(kept) - len(bad),
        "n_bad": len(bad),
        "bad_coords": np.asarray(bad)[:20].tolist(),
    }


def write_slide_qc(
    out_dir: Path,
    slide_id: str,
    thumb: tuple[np.ndarray, float],
    plan: TilePlan,
    tissue: TissueMap,
    kept: np.ndarray,
    bad: np.ndarray | None = None,
) -> dict[str, Any]:
    """Writes ``qc/<id>.jpg``, ``.geojson`` and ``.json``; returns the facts.

    Args:
        thumb: RGB thumbnail and its mpp.
        kept: Level-0 ``(x, y)`` of the tiles kept (bad ones included).
        bad: Level-0 ``(x, y)`` of the tiles that could not be read.

    Raises:
        OSError: The folder cannot be written.
    """
    folder = qc_dir(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    bad = np.zeros((0, 2), np.int64) if bad is None else np.asarray(bad).reshape(-1, 2)
    polygons = tissue.polygons_level0(plan.level0_mpp)
    facts = slide_facts(slide_id, plan, tissue, kept, bad)
    picture = draw_qc(thumb, plan, polygons, kept, bad, caption(facts))
    _atomic(folder / f"{slide_id}.jpg", lambda p: picture.save(p, "JPEG", quality=88))
    geojson = json.dumps(feature_collection(polygons), separators=(",", ":"))
    _atomic(folder / f"{slide_id}.geojson", lambda p: p.write_text(geojson, encoding="utf-8"))
    text = json.dumps(facts, indent=1)
    _atomic(folder / f"{slide_id}.json", lambda p: p.write_text(text, encoding="utf-8"))
    return facts


def caption(facts: dict[str, Any]) -> str:
    """One line under the picture: id, tiles, mpp and source, level and resize, tissue."""
    resize = (
        f"{facts['read_size']}->{facts['tile_size']} px"
        if facts["resized"]
        else f"{facts['tile_size']} px"
    )
    bad = f", {facts['n_bad']} UNREADABLE" if facts["n_bad"] else ""
    return (
        f"{facts['slide_id']}: {facts['n_kept']} tiles{bad} | {facts['level0_mpp']:g} um/px "
        f"({facts['mpp_source']}) | level {facts['read_level']}, {resize} | "
        f"tissue {facts['tissue_area_mm2']:.2f} mm2 ({facts['tissue']})"
    )


def draw_qc(
    thumb: tuple[np.ndarray, float],
    plan: TilePlan,
    polygons: list,
    kept: np.ndarray,
    bad: np.ndarray,
    text: str,
) -> Image.Image:
    """The QC picture: thumbnail, contours, tile grid, bad tiles and a caption bar."""
    rgb, thumb_mpp = thumb
    h, w = rgb.shape[:2]
    scale = min(MAX_UPSCALE, DISPLAY_PX / max(h, w, 1))
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    resample = Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.BICUBIC
    base = Image.fromarray(rgb).resize(size, resample).convert("RGBA")
    overlay = Image.new("RGBA", size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(overlay)
    k = scale * plan.level0_mpp / thumb_mpp  # display px per level-0 px
    step = plan.patch_size_level0 * k
    grid_px = 2 if step >= 24 else 1
    for x, y in np.asarray(kept).reshape(-1, 2).tolist():
        draw.rectangle([x * k, y * k, x * k + step, y * k + step], outline=TILE, width=grid_px)
    for x, y in np.asarray(bad).reshape(-1, 2).tolist():
        box = [x * k, y * k, x * k + step, y * k + step]
        draw.rectangle(box, fill=BAD_FILL, outline=BAD, width=2)
    width = max(2, round(min(size) / 300))
    for polygon in polygons:
        for ring in polygon:
            draw.line([(x * k, y * k) for x, y in ring], fill=CONTOUR, width=width, joint="curve")
    picture = Image.alpha_composite(base, overlay).convert("RGB")
    return _with_caption(picture, text)


def _with_caption(picture: Image.Image, text: str) -> Image.Image:
    """The picture under a white bar with ``text``, broken at `` | `` where it is too wide."""
    font = ImageFont.load_default(size=CAPTION_PX)
    width = max(picture.width, 640)
    lines = [""]
    for part in text.split(" | "):
        joined = f"{lines[-1]} | {part}" if lines[-1] else part
        if lines[-1] and font.getlength(joined) > width - 12:
            lines.append(part)
        else:
            lines[-1] = joined
    bar = len(lines) * (CAPTION_PX + 6) + 8
    out = Image.new("RGB", (width, picture.height + bar), (255, 255, 255))
    out.paste(picture, (0, bar))
    ImageDraw.Draw(out).multiline_text(
        (6, 5), "\n".join(lines), fill=(0, 0, 0), font=font, spacing=6
    )
    return out


def _atomic(path: Path, write: Any) -> None:
    """``write(tmp)`` into a fresh temp file, then renamed onto ``path`` (see ``atomic_path``).

    ``path`` is ``<out>/qc/<name>``: ``qc`` is reached without following a symlink.
    """
    with atomic_path(path, root=path.parent.parent) as tmp:
        write(tmp)


def read_facts(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Every valid ``qc/<id>.json`` of a folder, by slide id.

    One that cannot be read (a FIFO, a symlink, not JSON) or whose facts have
    other types than the report needs is left out, with one warning naming it.
    """
    facts: dict[str, dict[str, Any]] = {}
    with open_folder(out_dir, qc_dir(out_dir), create=False) as fd:
        names = sorted(n for n in os.listdir(fd) if n.endswith(".json")) if fd is not None else []
        for name in names:
            try:
                raw = read_regular(Path(name), FACTS_MAX_BYTES, dir_fd=fd)
                data = jsonsafe.loads(raw, name, max_bytes=FACTS_MAX_BYTES)
                problem = _facts_problem(data)
            except (OSError, ValueError) as exc:  # JsonError (too deep, not JSON) is one
                problem = f"unreadable ({exc})"
            if problem:
                logger.warning("%s left out of the report: %s", qc_dir(out_dir) / name, problem)
            else:
                facts[data["slide_id"]] = data
    return facts


def _facts_problem(data: Any) -> str:
    """What makes ``data`` no facts the report can show (``""``: nothing)."""
    if not isinstance(data, dict):
        return "not a JSON object"
    for key, kind in _FACT_TYPES.items():
        if not _fits(data.get(key), kind):
            return f"{key} is {json.dumps(data.get(key))[:40]}, not {kind.__name__}"
    return ""


def _fits(value: Any, kind: type) -> bool:
    if kind in (str, bool):
        return isinstance(value, kind)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) if kind is int else math.isfinite(value)
