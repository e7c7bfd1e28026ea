"""One slide's pictures of one model's result: their names, what they record, and removing them.

Names: ``qc/<id>.<model>.heatmap.jpg``, ``.top.jpg`` and ``.geojson``; for a
TRIDENT job folder the coords folder the features come from is in the name too
(``qc/<id>.<model>.20x_224px_0px_overlap.heatmap.jpg``,
:func:`~histoserve.results.sources.tiling_of`), so runs of another
magnification, tile size or overlap into one folder keep their own pictures.

Each picture records the :func:`~histoserve.heads.results.answer_sha256` of
the result it shows: the JPEGs in their comment (``histoserve
answer_sha256=<hex>``), the GeoJSON as its collection's ``answer_sha256``
property. They are written as one unit, the heatmap renamed into place after
the others and the result after the heatmap
(:func:`~histoserve.heads.pictures.write_pictures`), so the heatmap speaks
for the set: :func:`shown_answer` reads its comment (the JPEG header only,
no pixels) and resume compares it with the result's.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from histoserve.atomic import open_folder, open_regular

QC_DIR = "qc"
COMMENT_PREFIX = "histoserve answer_sha256="


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
    from PIL import Image

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
