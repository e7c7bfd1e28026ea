"""One PNG per model: throughput and p50 latency against concurrency, per protocol.

Top row: tiles/s per protocol with the limit (dashed) and both baselines
(V2 binary pixels); bottom row: p50 latency. Columns: tiles per request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STYLE = {"histoserve": "-o", "nobatch": ":s", "naive": "--^"}


def _series(cells: list[dict[str, Any]], server: str, protocol: str, tiles: int, key: str):
    """``(concurrencies, values)`` of one line; repeated cells (target runs) are averaged."""
    by_c: dict[int, list[float]] = {}
    for c in cells:
        if (c["server"], c["protocol"], c["tiles"]) == (server, protocol, tiles) and c.get(key):
            by_c.setdefault(c["concurrency"], []).append(c[key])
    xs = sorted(by_c)
    return xs, [sum(by_c[x]) / len(by_c[x]) for x in xs]


def _lines(top_ax: Any, bottom: Any, cells: list[dict[str, Any]], protocols: list[str], tiles: int):
    """histoserve per protocol, then both baselines (V2 binary pixels), on one column."""
    series = [("histoserve", p, STYLE["histoserve"], None, f"histoserve {p}") for p in protocols]
    series += [
        ("nobatch", "v2-pixels", STYLE["nobatch"], "grey", "(a) batching off"),
        ("naive", "v2-pixels", STYLE["naive"], "black", "(b) naive KServe"),
    ]
    for server, protocol, style, color, name in series:
        for key, ax in (("throughput", top_ax), ("p50_ms", bottom)):
            x, y = _series(cells, server, protocol, tiles, key)
            if x:
                ax.plot(x, y, style, color=color, label=name)


def _decorate(top_ax: Any, bottom: Any, title: str, limits: dict[str, float]) -> None:
    for (name, value), style in zip(limits.items(), (":", "--"), strict=False):
        top_ax.axhline(value, color="red", linestyle=style, label=name)
    top_ax.set_title(title)
    top_ax.set_ylabel("tiles/s")
    bottom.set_ylabel("p50 latency (ms)")
    bottom.set_yscale("log")
    for ax in (top_ax, bottom):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.grid(True, alpha=0.3)
    top_ax.legend(fontsize=7)


def plot_model(label: str, model: dict[str, Any], path: Path) -> Path:
    """Draws ``model``'s matrix and baselines to ``path`` (PNG) and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eff = model["targets"]["efficiency"]["cell"]
    many = model["targets"]["many_clients"]["runs"]["histoserve"]
    cells = model["cells"] + model["baselines"] + [eff, *many]
    sizes = sorted({c["tiles"] for c in cells})
    protocols = list(dict.fromkeys(c["protocol"] for c in model["cells"]))
    top = str(model["case"]["max_batch_size"])
    limits = {
        f"limit, batch {b}": model["limit"][b]["tiles_per_s"]
        for b in ("1", top)
        if b in model["limit"]
    }
    fig, axes = plt.subplots(2, len(sizes), figsize=(6 * len(sizes), 8), squeeze=False)
    for col, tiles in enumerate(sizes):
        _lines(axes[0][col], axes[1][col], cells, protocols, tiles)
        _decorate(axes[0][col], axes[1][col], f"{label}: {tiles}-tile requests", limits)
    fig.suptitle(
        f"{label} ({model['dtype']}): closed-loop load, side by side with the limit and baselines"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
