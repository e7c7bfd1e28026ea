"""``results.md``'s Triton section: the check, the paired cells, the ratios, what is unfair."""

from __future__ import annotations

from typing import Any

from bench.markdown import CELL_HEADER, cell_row
from bench.markdown import number as _f

# The goals against Triton (ratios of one run on one machine).
SINGLE_TILE_GOAL = 1.25  # 64 single-tile clients, binary REST and gRPC; p99 <= Triton's
MANY_TILE_GOAL = 1.4  # 16 clients x 32 tiles, binary REST


def _goal(pair: dict[str, Any]) -> tuple[str, bool | None]:
    """The goal text for a pair and whether it was met (None: no goal for this cell)."""
    ratio = pair.get("throughput_ratio")
    if pair["tiles"] == 1 and pair["clients"] >= 64:
        p99_ok = None
        if pair.get("histoserve_p99_ms") is not None and pair.get("triton_p99_ms") is not None:
            p99_ok = pair["histoserve_p99_ms"] <= pair["triton_p99_ms"]
        met = None if ratio is None else ratio >= SINGLE_TILE_GOAL and bool(p99_ok)
        return f"≥ {SINGLE_TILE_GOAL}x, p99 ≤ Triton's", met
    if pair["tiles"] >= 32 and pair["protocol"] == "v2-pixels":
        return f"≥ {MANY_TILE_GOAL}x", None if ratio is None else ratio >= MANY_TILE_GOAL
    return "–", None


def triton_section(label: str, model: dict[str, Any]) -> list[str]:
    """The lines for one model (empty when the model has no Triton part)."""
    part = model.get("triton")
    if not part:
        return []
    lines = [f"### {label}: histoserve vs NVIDIA Triton", ""]
    settings = part.get("settings", {})
    if settings:
        lines += [
            f"{settings['version']}, Python backend calling the same package, dynamic batcher "
            f"(max_batch_size={settings['max_batch_size']}, max_queue_delay="
            f"{settings['max_queue_delay_ms']} ms), {settings['instances']} instance. Each pair "
            "below ran back to back (histoserve first).",
            "",
        ]
    idle = model.get("idle_latency", {})
    if isinstance(idle.get("triton"), dict):
        t, h = idle["triton"], idle["histoserve"]
        lines += [
            f"- idle single-tile latency (V2 binary pixels): Triton {_f(t['median_ms'])} ms, "
            f"histoserve {_f(h['median_ms'])} ms, in-process forward {_f(idle['forward_ms'])} ms "
            "(medians)."
        ]
    check = part.get("check", {})
    for server, protocols in check.items():
        if isinstance(protocols, dict):
            lines.append(
                f"- served embeddings vs in-process forward, {server}: "
                + ", ".join(
                    f"{p} max |diff| {_f(r.get('max_abs'), 6)}, min cosine {_f(r.get('min_cosine'), 6)}"
                    for p, r in protocols.items()
                )
            )
    if "skipped" in part:
        return [*lines, "", f"Triton not measured: {part['skipped']}", ""]
    lines += [
        "",
        "| protocol | clients x tiles | histoserve tiles/s | Triton tiles/s | ratio "
        "| p50 ms H / T | p99 ms H / T | Triton mean batch | goal | |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    triton_cells = {
        (c["protocol"], c["concurrency"], c["tiles"]): c
        for c in part.get("cells", [])
        if c["server"] == "triton"
    }
    for pair in part.get("pairs", []):
        goal, met = _goal(pair)
        verdict = "–" if met is None else ("**met**" if met else "**missed**")
        t = triton_cells.get((pair["protocol"], pair["clients"], pair["tiles"]), {})
        lines.append(
            f"| {pair['protocol']} | {pair['clients']} x {pair['tiles']} "
            f"| {_f(pair.get('histoserve_tps'))} | {_f(pair.get('triton_tps'))} "
            f"| {_f(pair.get('throughput_ratio'), 2)} "
            f"| {_f(pair.get('histoserve_p50_ms'))} / {_f(pair.get('triton_p50_ms'))} "
            f"| {_f(pair.get('histoserve_p99_ms'))} / {_f(pair.get('triton_p99_ms'))} "
            f"| {_f(t.get('mean_batch'))} | {goal} | {verdict} |"
        )
    lines += ["", *CELL_HEADER, *(cell_row(c) for c in part.get("cells", []))]
    lines += ["", "What makes this comparison unfair:", ""]
    lines += [f"- {note}" for note in part.get("unfair", [])]
    return [*lines, ""]
