"""``results.md``: the targets first, then per model the limit, the matrix and baselines."""

from __future__ import annotations

from typing import Any

from bench.markdown import CELL_HEADER, cell_row
from bench.markdown import number as _f
from bench.matrix.targets import CLIENTS_TARGET, EFFICIENCY_TARGET, IDLE_BUDGET_MS
from bench.stages.coldstart import section as coldstart_section
from bench.stages.defaults import section as defaults_section
from bench.stages.frontends import section as frontends_section
from bench.stages.gil import section as gil_section
from bench.stages.instances import section as instances_section
from bench.stages.jpeg_transport import section as slide_reading_section
from bench.stages.null_rate import section as null_section
from bench.stages.workers import section as workers_section
from bench.triton.report import triton_section


def _verdict(met: bool | None) -> str:
    return "–" if met is None else ("**met**" if met else "**missed**")


def target_rows(label: str, model: dict[str, Any]) -> list[str]:
    """The three target rows of one model."""
    eff = model["targets"]["efficiency"]
    many = model["targets"]["many_clients"]
    idle = model["idle_latency"]
    cell = eff["cell"]
    lo, hi = eff.get("efficiency_range", [None, None])
    rows = [
        f"| {label} | end-to-end / limit, V2 binary pixels, {cell['tiles']}-tile requests, "
        f"{cell['concurrency']} clients | {_f(eff.get('efficiency'), 2)} ({_f(lo, 2)}–{_f(hi, 2)}): "
        f"{_f(cell.get('throughput'))} vs {_f(eff['limit'])} tiles/s | ≥ {EFFICIENCY_TARGET} "
        f"| {_verdict(eff.get('met'))} |"
    ]
    tput = many["throughput"]
    rows.append(
        f"| {label} | {many['clients']} single-tile clients, histoserve / baseline (b) "
        f"| {_f(many.get('vs_naive'), 2)}x: {_f(tput['histoserve'])} vs {_f(tput['naive'])} tiles/s "
        f"(vs (a): {_f(many.get('vs_nobatch'), 2)}x; at the limit it would be "
        f"{_f(many.get('ceiling_vs_naive'), 2)}x) | ≥ {CLIENTS_TARGET}x | {_verdict(many.get('met'))} |"
    )
    hs = idle["histoserve"]
    met = hs["overhead_ms"] <= IDLE_BUDGET_MS
    rows.append(
        f"| {label} | idle single-tile latency − single-tile forward | {hs['overhead_ms']:+.1f} ms "
        f"({hs['median_ms']:.1f} vs {idle['forward_ms']:.1f} ms) | ≤ +{IDLE_BUDGET_MS:.0f} ms "
        f"| {_verdict(met)} |"
    )
    return rows


def targets_table(results: dict[str, Any]) -> list[str]:
    """The targets of every model as one Markdown table."""
    lines = ["| model | target | measured | goal | |", "| --- | --- | --- | --- | --- |"]
    for label, model in results["models"].items():
        lines += target_rows(label, model)
    return lines


def model_section(label: str, model: dict[str, Any], png: str | None) -> list[str]:
    """Limit, idle latency, matrix, baselines and the time split of one model."""
    case, hs = model["case"], model["server_settings"]["histoserve"]
    lines = [
        f"## {label}: `{case['spec']}` geometry, preset `{case['preset']}`, {model['dtype']}, "
        f"{model['package_mb']:.0f} MB package",
        "",
        f"histoserve: max_batch_size={hs['max_batch_size']}, max_latency_ms={hs['max_latency_ms']}, "
        f"max_queue_size={hs['max_queue_size']}, preprocess_workers={hs['preprocess_workers']}, "
        f"forward_runner={hs.get('forward_runner', 'torch')}. "
        "Baseline (a): the same server with max_batch_size=1. Baseline (b): the naive KServe model.",
        "",
    ]
    if png:
        lines += [f"![{label}]({png})", ""]
    lines += ["### Limit (in-process forward, preprocessing excluded)", ""]
    lines += ["| batch | tiles/s | median ms/batch | runs |", "| --- | --- | --- | --- |"]
    for b, r in model["limit"].items():
        lines.append(f"| {b} | {r['tiles_per_s']:.1f} | {r['median_ms']:.1f} | {r['runs']} |")
    idle = model["idle_latency"]
    lines += ["", "### Idle single-tile latency (V2 binary pixels, interleaved with forwards)", ""]
    lines += [
        "| path | median ms | p90 ms | minus forward (paired median) |",
        "| --- | --- | --- | --- |",
    ]
    lines.append(f"| in-process forward, batch 1 | {idle['forward_ms']:.1f} | – | – |")
    for name in ("histoserve", "nobatch", "naive"):
        r = idle[name]
        lines.append(
            f"| {name} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} | {r['overhead_ms']:+.1f} |"
        )
    lines += ["", "### End-to-end matrix and baselines", "", *CELL_HEADER]
    targets = [
        model["targets"]["efficiency"]["cell"],
        *model["targets"]["many_clients"]["runs"]["histoserve"],
    ]
    lines += [cell_row(c) for c in model["cells"] + targets + model["baselines"]]
    lines += ["", *time_split(model), ""]
    lines += triton_section(label, model)
    return lines


def time_split(model: dict[str, Any]) -> list[str]:
    """Where the time goes in the target cells (server metrics over the window)."""
    eff = model["targets"]["efficiency"]
    c = eff["cell"]
    lines = ["### Where the time goes (target cells)", ""]
    if "forward_busy" in c:
        lines.append(
            f"- Efficiency cell: the device worker ran forwards {100 * c['forward_busy']:.0f}% of "
            f"the window (batches of {c['mean_batch']:.1f}, {c['forward_ms_per_batch']:.0f} ms "
            f"each); inside the server a forward ran at "
            f"{100 * eff.get('in_server_forward_vs_limit', 0):.0f}% of the in-process limit; "
            f"stage 1 {_f(c.get('preprocess_ms'), 2)} ms per request; queue wait "
            f"{_f(c.get('queue_wait_ms'))} ms per tile; CPU: server {_f(c.get('server_cores'), 2)}, "
            f"client {_f(c.get('client_cores'), 2)}, other processes {_f(c.get('other_cores'), 2)} cores."
        )
    many = model["targets"]["many_clients"]
    lines.append(
        f"- Many single-tile clients: histoserve ran at {100 * many['of_limit']:.0f}% of the limit "
        f"({many['limit']:.1f} tiles/s at batch {model['case']['max_batch_size']}); the ratio to (b) "
        "is bounded by the limit over (b)'s throughput."
    )
    for name, runs in many["runs"].items():
        r = runs[0]
        lines.append(
            f"- {many['clients']} single-tile clients, {name}: "
            + ", ".join(f"{x.get('throughput', 0):.1f}" for x in runs)
            + f" tiles/s; mean batch {_f(r.get('mean_batch'))}, forward busy "
            f"{_f(100 * r['forward_busy'] if 'forward_busy' in r else None, 0)}%, server "
            f"{_f(r.get('server_cores'), 2)} cores, other {_f(r.get('other_cores'), 2)} cores."
        )
    return lines


def stage1_section(stage1: dict[str, Any]) -> list[str]:
    """Stage-1 costs per tile."""
    w = stage1["workers"]
    lines = [
        "## Stage 1: wire parse + decode + validate + transform, per tile",
        "",
        f"| format | bytes/tile | µs/tile, one thread | µs/tile, pool of {w} | pool speedup |",
        "| --- | --- | --- | --- | --- |",
    ]
    for fmt, r in stage1["formats"].items():
        lines.append(
            f"| {fmt} | {r['bytes_per_tile']:.0f} | {r['per_thread_us']:.1f} | {r['pool_us']:.1f} "
            f"| {r['pool_speedup']:.2f} |"
        )
    lines.append(
        f"| naive (b), pixels: stock KServe binary decode | – "
        f"| {stage1['naive_decode_us']:.1f} | – | – |"
    )
    lines.append(
        f"| naive (b), pixels: float32 `/255`, mean/std on the CPU | – "
        f"| {stage1['naive_normalise_us']:.1f} | – | – |"
    )
    return lines


def markdown(results: dict[str, Any], pngs: dict[str, str]) -> str:
    """The whole ``results.md``."""
    m = results["meta"]
    lines = [
        "# histoserve benchmark results",
        "",
        f"Profile `{m['profile']}`, {m['started_utc']}, {m.get('duration_s', 0):.0f} s. Machine: "
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, device {m['device']}"
        f"{' (' + m['gpu'] + ')' if m.get('gpu') else ''}; Python {m['python']}, torch {m['torch']}, "
        f"kserve {m['kserve']}; {m['threads']} torch/OpenMP threads in every process. "
        f"Load average at start {m['loadavg_start']}, at end {m.get('loadavg_end')}.",
        "",
        "## Targets",
        "",
        *targets_table(results),
        "",
    ]
    for label, model in results["models"].items():
        lines += model_section(label, model, pngs.get(label))
    lines += null_section(results.get("null_model"))
    lines += frontends_section(results.get("frontends"))
    lines += defaults_section(results.get("defaults"))
    lines += instances_section(results.get("instances"))
    lines += gil_section(results.get("gil"))
    lines += workers_section(results.get("workers"))
    if results.get("stage1"):
        lines += stage1_section(results["stage1"])
    lines += slide_reading_section(results.get("slide_reading"))
    lines += coldstart_section(results.get("coldstart"))
    return "\n".join(lines) + "\n"
