"""Per-slide bulk RNA counts for multimodal models (the manifest's ``bulk_rna`` column).

The file holds one slide's raw counts in the model's input gene order (the
server's ``genes_in``, from ``GET /v2/models/{name}/config``); the same vector
goes with every tile of the slide. Accepted forms: a ``.npy`` vector; a text or
CSV file with one row of counts; or one count per line, optionally after a
header line and a gene column (``gene,count``: the last field of each line).

Only reading is checked here. The server is the one judge of the values
(gene count, finite, non-negative): its 400 names the input and the reason,
and that slide fails with it, so client and server can never disagree.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from histoserve.errors import SlideError

_SPLIT = re.compile(r"[,;\t ]+")


def read_bulk_rna(path: Path, n_genes: int) -> np.ndarray:
    """The counts vector, ``float32 [G]`` (``n_genes``: the model's G, 0 when it takes none).

    Raises:
        SlideError: Unreadable file or a model without bulk RNA (the message
            names the manifest column).
    """
    if n_genes == 0:
        raise SlideError(
            f"bulk RNA file {path} given but the model takes no bulk RNA: "
            "drop the manifest's bulk_rna column"
        )
    try:
        values = _load_counts(Path(path))
    except (OSError, ValueError) as exc:
        raise SlideError(
            f"bulk RNA file {path}: cannot read it ({exc}); fix the manifest's bulk_rna column"
        ) from exc
    if values.size == 0:
        raise SlideError(
            f"bulk RNA file {path} holds no counts; fix the manifest's bulk_rna column"
        )
    return values


def _load_counts(path: Path) -> np.ndarray:
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False).astype(np.float32).ravel()
    rows = [_SPLIT.split(line.strip()) for line in path.read_text().splitlines() if line.strip()]
    if rows and not _is_number(rows[0][-1]):
        rows = rows[1:]  # a header line
    if len(rows) == 1:
        return np.array([float(v) for v in rows[0]], np.float32)
    return np.array([float(row[-1]) for row in rows], np.float32)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
