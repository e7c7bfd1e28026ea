"""``slides.csv``: one row per slide and slide model, rebuilt from the result files on disk.

Columns: ``slide_id``, ``model``, ``package_sha256``, ``tile_model``,
``tiling`` (the TRIDENT coords folder the features come from,
``20x_224px_0px_overlap``; empty for flat and CLAM folders), then one
column per class (the class names the model's spec gives, ``class_<i>`` when
it gives none; a name equal to a fixed column gets ``class:`` in front), the
prediction's value for that class. Several models in one folder share the
file: each row has its own model's classes filled in, the others empty.

Like ``report.html`` it is built at the end of every run from every complete
result file (``slide_features_*/<id>.h5``, :mod:`~histoserve.heads.result_file`)
under the folders given (``aggregate`` gives every TRIDENT coords folder of
the job folder: runs of another magnification, tile size or overlap are rows
of their own, their ``tiling`` naming their pictures,
:mod:`~histoserve.heads.pictures`), so it covers earlier runs and the other shards too;
the last shard to finish writes the whole table. It is a view of the results
that hold now: a result whose features file vanished, or was replaced or
rewritten since, has no row (:func:`~histoserve.heads.result_file.made_from_current`).
Every cell of text goes through :func:`~histoserve.text.csv_cell` (a class or
slide id starting with ``=`` is no formula in a spreadsheet); predictions are
numbers and written as numbers (``-0.5``, which a spreadsheet or pandas reads
as a number); :func:`read_table` gives the text back. Written whole under a
temp name and renamed.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from histoserve import jsonsafe
from histoserve.atomic import atomic_path, read_regular
from histoserve.heads.result_file import RESULTS_PREFIX, made_from_current, read_result
from histoserve.results.sources import tiling_of
from histoserve.text import csv_cell, csv_text

TABLE_FILE = "slides.csv"
FIXED_COLUMNS = ("slide_id", "model", "package_sha256", "tile_model", "tiling")
_MAX_BYTES = 1 << 30


def collect_rows(roots: Iterable[Path]) -> tuple[list[str], list[dict[str, str]]]:
    """The class columns (in first-seen order) and one row per complete result under ``roots``."""
    classes: dict[str, None] = {}
    rows = []
    for root in sorted(set(roots)):
        for path in sorted(Path(root).glob(f"{RESULTS_PREFIX}*/*.h5")):
            if path.name.startswith("."):
                continue
            result = read_result(path)
            if result is None or not made_from_current(path, result[0]):
                continue  # no numbers for a slide whose features vanished or changed
            row = {**_row(*result), "tiling": tiling_of(Path(root))}
            classes.update(dict.fromkeys(k for k in row if k not in FIXED_COLUMNS))
            rows.append(row)
    rows.sort(key=lambda r: (r["slide_id"], r["model"], r["tiling"]))
    return list(classes), rows


def _row(attrs: dict[str, Any], prediction: np.ndarray | None) -> dict[str, str]:
    row = {name: str(attrs.get(name) or "") for name in FIXED_COLUMNS}
    names = _classes(attrs.get("classes"))
    values = [] if prediction is None else np.asarray(prediction, np.float64).reshape(-1).tolist()
    for i, value in enumerate(values):
        name = names[i] if i < len(names) else f"class_{i}"
        row[f"class:{name}" if name in FIXED_COLUMNS else name] = f"{value:.6g}"
    return row


def _classes(text: Any) -> list[str]:
    try:
        names = jsonsafe.loads(text, "class names") if isinstance(text, str) else []
    except ValueError:
        return []
    return [str(n) for n in names] if isinstance(names, list) else []


def write_table(out_dir: Path, roots: Iterable[Path]) -> Path:
    """Writes ``out_dir/slides.csv`` from the results under ``roots``; returns its path.

    Raises:
        OSError: The folder cannot be written.
    """
    classes, rows = collect_rows(roots)
    columns = [*FIXED_COLUMNS, *classes]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([csv_cell(c) for c in columns])
    for row in rows:  # class cells are numbers (`_row`), written as numbers: -0.5, not '-0.5
        writer.writerow(
            [row.get(c) or "" if c in classes else csv_cell(row.get(c) or "") for c in columns]
        )
    path = Path(out_dir) / TABLE_FILE
    with atomic_path(path) as tmp:
        tmp.write_text(buf.getvalue(), encoding="utf-8")
    return path


def read_table(out_dir: Path) -> list[dict[str, str]]:
    """The rows of ``out_dir/slides.csv`` with each cell's text as given (``[]`` when none)."""
    try:
        text = read_regular(Path(out_dir) / TABLE_FILE, _MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        return []
    return [
        {csv_text(k): csv_text(v) for k, v in row.items()}
        for row in csv.DictReader(io.StringIO(text))
    ]
