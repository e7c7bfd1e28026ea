"""``<out>/report.html``: every slide of an output folder on one page, suspicious ones first.

Built at the end of each run from what the folder holds, so it covers the
slides of earlier runs and of other shards too: ``status.csv`` (the latest
line of each slide that was not ``skipped``, for its status, time and error)
and ``qc/<id>.json`` (mpp and its source, level, resize, tissue area, tiles;
see :mod:`~histoserve.review.qc`). Each slide gets a row with its QC
picture. Rows are sorted by how suspicious the slide is, in this order:

``failed`` (any reason), ``no tissue`` (no tile kept), ``unreadable tiles``,
``tiny tissue`` (under :data:`TINY_TISSUE_MM2`), ``resized`` (no pyramid level
at the model's mpp: tiles were read larger and resized), then the rest.
A slide that failed before its tile plan (unreadable file, no mpp) has no
picture but has its row and reason. A slide that a slide model ran on
(``--slide-model``, ``histoserve aggregate``) also shows, per model, its
prediction (``slides.csv``, :mod:`~histoserve.heads.table`) and its
attention heatmap (``qc/<id>.<model>.heatmap.jpg``) with the QuPath GeoJSON. What is malformed in the folder (a
``status.csv`` line cut short by a full disk, a ``qc/<id>.json`` of other
types) is left out with one warning naming the file, never a crash: the
report shows the rest.
"""

from __future__ import annotations

import html
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from histoserve.atomic import atomic_path
from histoserve.heads.pictures import picture_base
from histoserve.heads.table import FIXED_COLUMNS, read_table
from histoserve.results.status import STATUS_FILE, read_status_checked
from histoserve.review.qc import QC_DIR, read_facts

REPORT_FILE = "report.html"
TINY_TISSUE_MM2 = 1.0
FLAGS = ("failed", "no tissue", "unreadable tiles", "tiny tissue", "resized")
logger = logging.getLogger("histoserve.embed")


@dataclass
class SlideRow:
    """One slide in the report: its latest status line and its QC facts (if any)."""

    slide_id: str
    status: dict[str, str] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    heads: list[dict[str, str]] = field(default_factory=list)

    @property
    def flags(self) -> list[str]:
        """The suspicious things about this slide, in :data:`FLAGS` order."""
        f, out = self.facts, []
        if self.status.get("status") == "failed":
            out.append("failed")
        if f and f.get("n_kept", 0) == 0 and not f.get("n_bad"):
            out.append("no tissue")
        if f.get("n_bad"):
            out.append("unreadable tiles")
        if f and 0 < f.get("tissue_area_mm2", 0.0) < TINY_TISSUE_MM2:
            out.append("tiny tissue")
        if f.get("resized"):
            out.append("resized")
        return out

    def sort_key(self) -> tuple[int, str]:
        """Most suspicious first, then by slide id."""
        flags = self.flags
        return (FLAGS.index(flags[0]) if flags else len(FLAGS), self.slide_id)


def collect_rows(out_dir: Path) -> list[SlideRow]:
    """Every slide named in ``status.csv`` or ``qc/``, most suspicious first."""
    rows: dict[str, SlideRow] = {}
    lines, bad = read_status_checked(out_dir)
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
        lines_word = "line" if len(bad) == 1 else "lines"
        path = Path(out_dir) / STATUS_FILE
        logger.warning(
            "%s: %d malformed %s left out of the report (line %s)",
            path,
            len(bad),
            lines_word,
            shown,
        )
    for line in lines:
        row = rows.setdefault(line["slide_id"], SlideRow(line["slide_id"]))
        if line["status"] != "skipped" or not row.status:
            row.status = line
    for slide_id, facts in read_facts(out_dir).items():
        rows.setdefault(slide_id, SlideRow(slide_id)).facts = facts
    try:
        heads = read_table(out_dir)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError too: shown without predictions
        logger.warning("%s left out of the report: %s", Path(out_dir) / "slides.csv", exc)
        heads = []
    for head in heads:
        if head.get("slide_id"):
            rows.setdefault(head["slide_id"], SlideRow(head["slide_id"])).heads.append(head)
    return sorted(rows.values(), key=SlideRow.sort_key)


def write_report(out_dir: Path) -> Path:
    """Writes ``<out>/report.html`` (atomically, replacing a symlink there) and returns its path.

    Raises:
        OSError: The folder cannot be written.
        UsageError: ``status.csv`` is a symlink or not a regular file.
    """
    out_dir = Path(out_dir)
    rows = collect_rows(out_dir)
    page = render(rows, out_dir)
    path = out_dir / REPORT_FILE
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # the file just made
        with open(fd, "w", encoding="utf-8") as handle:
            handle.write(page)
    return path


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #ddd;padding:6px 8px;vertical-align:top;text-align:left}
th{background:#f4f4f4;position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.flag{display:inline-block;border-radius:3px;padding:1px 6px;margin:1px;color:#fff;
 background:#b35;font-size:90%}
.flag.resized,.flag.tiny{background:#c80}
.ok{color:#272}
.err{color:#b00;max-width:32em;overflow-wrap:anywhere}
img{max-width:360px;border:1px solid #ccc}
"""


def render(rows: list[SlideRow], out_dir: Path) -> str:
    """The report page."""
    counts: dict[str, int] = {}
    for row in rows:
        status = row.status.get("status", "planned")
        counts[status] = counts.get(status, 0) + 1
    flagged = sum(1 for row in rows if row.flags)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    head = (
        f"<h1>histoserve embed: {html.escape(out_dir.name)}</h1>"
        f"<p>{len(rows)} slides: {summary}; <b>{flagged} to check</b> (listed first). "
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S')}. Green: tissue contours "
        f"(<code>qc/&lt;id&gt;.geojson</code>, QuPath); blue: kept tiles; red: unreadable.</p>"
    )
    columns = (
        "QC", "slide", "status", "flags", "tiles", "tissue mm²", "mpp (source)",
        "level, read → tile", "time s", "error", "slide model",
    )  # fmt: skip
    header = "".join(f"<th>{c}</th>" for c in columns)
    body = "\n".join(_row_html(row) for row in rows)
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>histoserve embed report'
        f"</title><style>{_STYLE}</style></head><body>{head}"
        f"<table><thead><tr>{header}</tr></thead><tbody>\n{body}\n</tbody></table></body></html>\n"
    )


def _row_html(row: SlideRow) -> str:
    f, s, esc = row.facts, row.status, html.escape
    name = quote(row.slide_id)
    picture = (
        f'<a href="{QC_DIR}/{name}.jpg"><img src="{QC_DIR}/{name}.jpg" loading="lazy"></a>'
        f'<br><a href="{QC_DIR}/{name}.geojson">GeoJSON</a>'
        if f
        else "no picture"
    )
    flags = (
        "".join(f'<span class="flag {flag.split()[0]}">{esc(flag)}</span>' for flag in row.flags)
        or '<span class="ok">ok</span>'
    )
    tiles = s.get("n_tiles", "") if not f else f"{f.get('n_kept', 0)}"
    if f.get("n_bad"):
        tiles += f" (+{f['n_bad']} unreadable)"
    cells = [
        picture,
        esc(row.slide_id) + (f"<br><small>{esc(s['path'])}</small>" if s.get("path") else ""),
        esc(s.get("status", "not finished")),
        flags,
        f'<td class="num">{esc(str(tiles))}',
        f'<td class="num">{f["tissue_area_mm2"]:.3f}' if f else "",
        esc(f"{f['level0_mpp']:g} ({f['mpp_source']})") if f else "",
        esc(_level(f)) if f else "",
        f'<td class="num">{esc(s.get("seconds", ""))}',
        f'<span class="err">{esc(s.get("error", ""))}</span>',
        "".join(_head_html(row.slide_id, head) for head in row.heads),
    ]
    return "<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}" for c in cells) + "</tr>"


def _head_html(slide_id: str, head: dict[str, str]) -> str:
    """One slide model's prediction (top class first) and its heatmap, linked to the GeoJSON."""
    scores = []
    for name, text in head.items():
        try:
            value = float(text) if name not in FIXED_COLUMNS and text else None
        except ValueError:
            value = None
        if value is not None:
            scores.append((value, name))
    scores.sort(reverse=True)
    shown = ", ".join(f"<b>{html.escape(n)}</b> {v:.3g}" if i == 0 else f"{html.escape(n)} {v:.3g}"
                      for i, (v, n) in enumerate(scores[:4]))  # fmt: skip
    model, tiling = head.get("model", ""), head.get("tiling", "")
    base = f"{QC_DIR}/{quote(picture_base(slide_id, model, tiling))}"
    label = f"{model} ({tiling})" if tiling else model
    return (
        f"<div>{html.escape(label)}: {shown or 'no prediction'}<br>"
        f'<a href="{base}.heatmap.jpg"><img src="{base}.heatmap.jpg" loading="lazy"></a>'
        f'<br><a href="{base}.geojson">QuPath GeoJSON</a></div>'
    )


def _level(facts: dict[str, Any]) -> str:
    read, tile = facts["read_size"], facts["tile_size"]
    resize = f"{read} → {tile} px (resized)" if facts.get("resized") else f"{tile} px"
    return f"level {facts['read_level']}, {resize}"
