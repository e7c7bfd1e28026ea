"""A picture of the Grafana dashboard drawn from a real Prometheus's answers (matplotlib).

Not Grafana: the same panels, in the same order and grid, each target's
``expr`` (variables filled) asked of Prometheus over a window with
``query_range`` and drawn as lines, legends from each target's
``legendFormat``. ``docs/dashboard.png`` is made this way by
``tests/integration/test_prometheus_queries.py`` with
``HISTOSERVE_DASHBOARD_PNG`` set (docs/deployment.md, "The dashboard").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.prometheus import Prometheus, fill_dashboard_variables

_SCALE = {  # Grafana's unit -> (factor, axis label)
    "bytes": (1 / 2**30, "GiB"),
    "s": (1000.0, "ms"),
    "percentunit": (100.0, "%"),
    "short": (1.0, ""),
}


def _legend(template: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


def draw_dashboard(
    dashboard: Mapping[str, Any],
    prometheus: Prometheus,
    variables: Mapping[str, str],
    window: tuple[float, float],
    path: Path,
    step_s: float = 1.0,
    shorten: str = "",
) -> None:
    """Draws every panel of ``dashboard`` over ``window`` (Unix seconds) into ``path`` (PNG);
    ``shorten`` is left out of the legends (a long common pod name prefix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dashboard["panels"])
    rows = max(p["gridPos"]["y"] // 8 for p in panels) + 1
    fig, axes = plt.subplots(rows, 2, figsize=(14, 2.6 * rows), squeeze=False)
    start, end = window
    for ax in axes.flat:
        ax.set_visible(False)
    for panel in panels:
        grid = panel["gridPos"]
        ax = axes[grid["y"] // 8][grid["x"] // 12]
        ax.set_visible(True)
        factor, unit = _SCALE.get(panel["fieldConfig"]["defaults"].get("unit", "short"), (1.0, ""))
        drawn = 0
        for target in panel["targets"]:
            expr = fill_dashboard_variables(target["expr"], variables)
            for labels, points in prometheus.query_range(expr, start, end, step_s):
                xs = [t - start for t, _ in points]
                ys = [v * factor for _, v in points]
                ax.plot(
                    xs,
                    ys,
                    linewidth=1.2,
                    label=_legend(target["legendFormat"], labels).replace(shorten, ""),
                )
                drawn += 1
        ax.set_title(panel["title"], fontsize=9, loc="left")
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=6, loc="upper left", ncol=2, frameon=False)
        else:
            ax.text(
                0.5, 0.5, "no data here (cluster exporter)", ha="center", transform=ax.transAxes
            )
    for ax in axes[-1]:
        ax.set_xlabel("seconds", fontsize=8)
    fig.suptitle(
        f"{dashboard['title']}: two CPU replicas on loopback, fresh, under load, then queues held",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
