"""The slide under a slide's pictures: found, checked to be the slide the features were made from, opened.

A heatmap is never drawn over another slide. :func:`verified_slide` finds
the slide and checks it:

- without ``slides_dir``: at the absolute path the features file's recorded
  identity names (:mod:`~histoserve.slides.identity`; not the path as
  ``embed`` was given it, which was relative to where it ran), with the
  recorded size and sampled digest;
- with ``slides_dir`` (``histoserve aggregate --slides DIR``): in that folder,
  under the file name the identity (else ``slide_path``) records, else any
  entry named ``<slide id>.<ext>``; with the recorded size and digest when
  the features record an identity. Features without one (TRIDENT's and
  CLAM's own files) get the slide found by its id.

:func:`open_slide` then opens it and checks its level-0 size against the one
the features file records (without one: the tiles must lie inside it). Any
mismatch gives no slide and the reason, which the heatmap's title states over
a blank canvas; the top tiles are then not drawn.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from histoserve.errors import SlideError
from histoserve.results.sources import SlideFeatures

logger = logging.getLogger("histoserve.aggregate")


def verified_slide(
    sf: SlideFeatures, slides_dir: Path | None = None, slide_id: str | None = None
) -> tuple[Path | None, str]:
    """The slide the features were made from, or None and why not (``""``: none recorded).

    ``slide_id``: the id to look for in ``slides_dir`` (default: the one the file records).
    """
    from histoserve.slides.identity import IDENTITY_ATTR, SlideIdentity

    raw = sf.attrs.get(IDENTITY_ATTR)
    recorded = SlideIdentity.from_attr(json.dumps(raw) if isinstance(raw, dict) else raw)
    if slides_dir is not None:
        slide_id = slide_id or str(sf.attrs.get("slide_id") or "")
        names = [Path(p).name for p in (recorded and recorded.path, sf.slide_path) if p]
        candidates = _candidates(Path(slides_dir), names, slide_id)
        if not candidates:
            wanted = " or ".join([*dict.fromkeys(names), f"{slide_id}.*"])
            return None, f"no slide {wanted} in {slides_dir}"
        reasons = []
        for path in candidates:
            why_not = "" if recorded is None else _same_content(path, recorded)
            if not why_not:
                return path, ""
            reasons.append(why_not)
        return None, reasons[0]
    if recorded is None:
        return None, "" if sf.slide_path is None else "the features record no slide identity"
    path = Path(recorded.path)
    why_not = _same_content(path, recorded)
    return (None, why_not) if why_not else (path, "")


def _candidates(slides_dir: Path, names: list[str], slide_id: str) -> list[Path]:
    """Entries of ``slides_dir`` by the recorded file names, then by ``<slide_id>.<ext>``."""
    found = [slides_dir / n for n in dict.fromkeys(names) if (slides_dir / n).exists()]
    try:
        entries = sorted(slides_dir.iterdir())
    except OSError:
        return found
    by_id = [
        p
        for p in entries
        if slide_id and p.stem == slide_id and p.suffix and not p.name.startswith(".")
    ]
    return [*found, *(p for p in by_id if p not in found)]


def _same_content(path: Path, recorded: Any) -> str:
    """``""`` when ``path`` has the recorded size and sampled digest, else why not."""
    from histoserve.slides.identity import slide_identity

    try:
        current = slide_identity(path)
    except SlideError:
        return f"{path.name} is not there any more"
    if current.size != recorded.size or current.digest != recorded.digest:
        return f"{path.name} is not the slide the features were made from"
    return ""


@contextlib.contextmanager
def open_slide(
    sf: SlideFeatures, slide_id: str, slides_dir: Path | None = None
) -> Iterator[tuple[Any, str]]:
    """The verified slide, open, and ``""``; or None and why it is not drawn."""
    path, why_not = verified_slide(sf, slides_dir, slide_id)
    reader = None
    if path is not None:
        try:
            from histoserve.slides.readers import SlideReader

            reader = SlideReader.open(path)
        except Exception as exc:  # pictures only: a blank canvas instead
            why_not = f"{path.name} cannot be read ({type(exc).__name__})"
    if reader is not None and (misfit := _misfit(reader, sf)):
        why_not = f"{path.name} {misfit}"
        reader.close()
        reader = None
    if why_not:
        logger.warning("slide %s: heatmap drawn without its slide: %s", slide_id, why_not)
    try:
        yield reader, why_not
    finally:
        if reader is not None:
            reader.close()


def _misfit(reader: Any, sf: SlideFeatures) -> str:
    """``""`` when level 0 is the recorded size (none recorded: every tile starts inside it)."""
    dims = tuple(int(v) for v in reader.dimensions)
    w, h = sf.attrs.get("level0_width"), sf.attrs.get("level0_height")
    if isinstance(w, int) and isinstance(h, int):
        return "" if dims == (w, h) else f"is {dims[0]}x{dims[1]} px, not the size recorded"
    top = sf.coords.max(axis=0) if len(sf.coords) else (0, 0)
    if int(top[0]) < dims[0] and int(top[1]) < dims[1]:
        return ""
    return f"is {dims[0]}x{dims[1]} px, smaller than the tiles' extent"


def background(reader: Any, sf: SlideFeatures) -> tuple[np.ndarray | None, tuple[int, int]]:
    """The slide's thumbnail and level-0 extent, else None and the tiles' extent."""
    if reader is None:
        return None, sf.extent
    try:
        from histoserve.heads.heatmap import DISPLAY_PX
        from histoserve.slides.readers import MppInfo
        from histoserve.tissue.detect import thumbnail

        width, height = reader.dimensions
        unit = MppInfo(1.0, "level-0 px")  # thumbnail scale in level-0 px per px
        rgb, _ = thumbnail(reader, unit, max(width, height) / DISPLAY_PX)
        return rgb, (int(width), int(height))
    except Exception as exc:  # pictures only: a blank canvas instead
        logger.info("no thumbnail under the heatmap (%s)", exc)
        return None, sf.extent
