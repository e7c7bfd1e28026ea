"""histoserve against Triton with two model instances each: both cores on the model.

``python -m bench.stages.instances [--out bench/results] [--rounds 2]``

The main Triton cells (:mod:`bench.triton.baseline`) give each server one instance
with one torch thread, so on the 2-core machine one core runs the model and
the other the front end, the load client and the neighbours. Measured in the
quiet full run, neither server then used more than about one core: the
forward is the bound, and the serving path no longer is. The configuration a
user would deploy on such a node puts both cores on the model: two instances
of one thread each (``--forward_runner gil_free --instances_per_device 2``
for histoserve; pytriton's instance group of two callables, each its own
package load, for Triton). Same package, batching settings, uint8 input and
normalisation as :mod:`bench.triton.baseline`; each cell runs on histoserve then on
Triton, for ``--rounds`` rounds, with the target (long) windows; the served
embeddings are checked first as in :func:`bench.triton.baseline.check_embeddings`.
Writes ``instances.json`` and ``instances.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.markdown import number
from bench.matrix.cells import Cell, LoadClient
from bench.profiles import PROFILES, ModelCase, Profile

INSTANCES = 2
CELLS = ((64, 1), (16, 32))
PROTOCOLS = ("v2-pixels", "v2-grpc")


def start_pair(profile: Profile, case: ModelCase, package: Path, log_dir: Path) -> dict[str, Any]:
    """histoserve and Triton, two instances of one torch thread each, ready."""
    from bench.servers import launch
    from bench.triton import baseline

    batching = {"max_batch_size": case.max_batch_size, "max_latency_ms": case.max_latency_ms}
    common = {"device": profile.device, "threads": profile.threads, "log_dir": log_dir}
    started = {
        "histoserve": launch.start_histoserve(
            package, model="bench", max_queue_size=profile.max_queue_size,
            workers=profile.preprocess_workers, kind="histoserve-x2", forward_runner="gil_free",
            instances=INSTANCES, **batching, **common,
        ),
        "triton": baseline.start_triton(
            package, model="bench", instances=INSTANCES, **batching, **common
        ),
    }  # fmt: skip
    launch.wait_all_ready(started)
    return started


def measure(
    profile: Profile, client: LoadClient, log_dir: Path, log: Callable[[str], None], rounds: int
) -> dict[str, Any]:
    """Every (cell, protocol) on both servers, ``rounds`` times; per-round ratios."""
    from bench.servers.packages import package_for
    from bench.triton import baseline

    case = profile.models[0]
    package = package_for(case, profile.device)
    started = start_pair(profile, case, package, log_dir)
    out: dict[str, Any] = {"model": case.label, "instances": INSTANCES, "threads": profile.threads}
    try:
        out["check"] = baseline.check_embeddings(package, started)
        pairs = []
        for index in range(rounds):
            for clients, tiles in CELLS:
                for protocol in PROTOCOLS:
                    pair = {}
                    for name, server in started.items():
                        cell = Cell(name, protocol, clients, tiles, target=True)
                        pair[name] = baseline.run_cell_counted(
                            client, server, cell, tile_size=224, speed_tps=300.0,
                            windows=profile.windows,
                        )  # fmt: skip
                    ratio = baseline.pair_ratio(protocol, clients, tiles, pair)
                    ratio.update(round=index, cells=pair)
                    log(f"  x{INSTANCES} {protocol} {clients}x{tiles}: {_line(ratio)}")
                    pairs.append(ratio)
        out["pairs"] = pairs
    finally:
        for server in started.values():
            server.stop()
    return out


def _line(pair: dict[str, Any]) -> str:
    if "throughput_ratio" not in pair:
        return "failed"
    return (
        f"histoserve {pair['histoserve_tps']:.1f} / Triton {pair['triton_tps']:.1f} tiles/s "
        f"= {pair['throughput_ratio']:.2f}x, p99 {pair['histoserve_p99_ms']:.0f} / "
        f"{pair['triton_p99_ms']:.0f} ms"
    )


def section(part: dict[str, Any] | None) -> list[str]:
    """Markdown for the two-instance comparison (empty when absent)."""
    if not part:
        return []
    lines = [
        f"## {part['model']}: histoserve vs Triton, {part['instances']} instances of "
        f"{part['threads']} torch thread each",
        "",
        "| round | protocol | clients x tiles | histoserve tiles/s | Triton tiles/s | ratio "
        "| p99 ms H / T | mean batch H / T | cores server H / T | other cores |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | --- | --- | --- |",
    ]
    for p in part.get("pairs", []):
        h, t = p["cells"]["histoserve"], p["cells"]["triton"]
        if "throughput_ratio" not in p:
            lines.append(f"| {p['round']} | {p['protocol']} | {p['clients']} x {p['tiles']} "
                         "| failed | | | | | | |")  # fmt: skip
            continue
        lines.append(
            f"| {p['round']} | {p['protocol']} | {p['clients']} x {p['tiles']} "
            f"| {p['histoserve_tps']:.1f} | {p['triton_tps']:.1f} | {p['throughput_ratio']:.2f} "
            f"| {p['histoserve_p99_ms']:.0f} / {p['triton_p99_ms']:.0f} "
            f"| {number(h.get('mean_batch'), 2)} / {number(t.get('mean_batch'), 2)} "
            f"| {number(h.get('server_cores'), 2)} / {number(t.get('server_cores'), 2)} "
            f"| {number(h.get('other_cores'), 2)} / {number(t.get('other_cores'), 2)} |"
        )
    return [*lines, ""]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the comparison on the full profile's demo package and writes the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.stages.instances", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    client = LoadClient()
    try:
        part = measure(profile, client, args.out / "logs.tmp", _log, args.rounds)
    finally:
        client.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "instances.json").write_text(json.dumps(part, indent=1), encoding="utf-8")
    (args.out / "instances.md").write_text("\n".join(section(part)), encoding="utf-8")
    return 0


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
