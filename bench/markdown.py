"""The one number format of ``results.md`` and the other benchmark tables, and its cell rows.

The row of one end-to-end cell is shared by the model sections
(:mod:`bench.report.results_md`) and the Triton section (:mod:`bench.triton.report`);
it lives here, below both, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def number(value: Any, digits: int = 1) -> str:
    """``value`` to ``digits`` decimals; "–" when it was not measured (``None``).

    Anything that is not a float (an int count, a label) is written as is.
    """
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def cell_row(c: dict[str, Any]) -> str:
    """One end-to-end cell as a row under :data:`CELL_HEADER` (skipped and failed cells say why)."""
    server = c["server"] + (" (target)" if c.get("target") else "")
    head = f"| {server} | {c['protocol']} | {c['tiles']} | {c['concurrency']} |"
    if "skipped" in c:
        return head + f" skipped: {c['skipped']} |" + " |" * 9
    if "failed" in c:
        return head + f" failed: {c['failed']} |" + " |" * 9
    errors = sum((c.get("errors") or {}).values())
    n = number
    return head + (
        f" {n(c['throughput'])} | {n(c.get('efficiency'), 2)} | {n(c['p50_ms'])} "
        f"| {n(c['p95_ms'])} | {n(c['p99_ms'])} | {n(c.get('mean_batch'))} | {c['requests']} "
        f"| {errors} | {n(c.get('server_cores'), 2)} / {n(c.get('client_cores'), 2)} "
        f"/ {n(c.get('other_cores'), 2)} |"
    )


CELL_HEADER = [
    "| server | protocol | tiles/req | clients | tiles/s | of limit | p50 ms | p95 ms | p99 ms "
    "| mean batch | requests | errors | cores: server / client / other |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
]


def target_rows(targets: list[dict[str, Any]]) -> list[str]:
    """A stage's targets as a Markdown table: ratio, goal (``>=``, or ``<=`` when ``at_most``), met.

    A target with ``p99_ms`` (histoserve's, the other server's) shows both beside its name.
    """
    lines = ["| target (means over rounds) | ratio | goal | met |", "| --- | ---: | ---: | --- |"]
    for t in targets:
        extra = f" (p99 {t['p99_ms'][0]:.0f} vs {t['p99_ms'][1]:.0f} ms)" if "p99_ms" in t else ""
        goal = f"{'<=' if t.get('at_most') else '>='} {t['goal']:.2f}"
        met = "yes" if t["met"] else "no"
        lines.append(f"| {t['target']}{extra} | {t['ratio']:.2f} | {goal} | {met} |")
    return lines


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], left: int = 2) -> list[str]:
    """A Markdown table: ``header``, then ``rows`` of cells (floats as :func:`number` writes them).

    The first ``left`` columns (labels) are left-aligned, the rest (figures) right-aligned.
    """
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" if i < left else "---:" for i in range(len(header))) + " |",
    ]
    lines += ["| " + " | ".join(number(c, 2) for c in row) + " |" for row in rows]
    return lines
