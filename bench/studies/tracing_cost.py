"""``python -m bench.studies.tracing_cost``: the server CPU one traced request costs.

Two servers of this checkout on the null model (:mod:`bench.servers.null_model`:
the request path alone, where a per-request cost shows most), one untraced and
one with ``--otel_endpoint`` at a loopback OTLP receiver in this process
(:mod:`harness.otlp`, ``--otel_sample_ratio 1``: every request traced and
exported), get the same single-tile V2 REST and gRPC requests from one client
at a time, in rounds that alternate which goes first. Per round and server:
the server process's CPU seconds (user + system, ``psutil``) per request,
which a machine shared with other work disturbs far less than throughput.
The difference is what tracing costs per request, the export (protobuf
encoding, the POST to the receiver) included. ``--before COMMIT`` adds that
commit's server (:mod:`bench.servers.before`: the same environment, only
``predictor/`` differs) as a third, untraced: what tracing off costs against
it. Results as JSON (``--out``) and a Markdown table on stdout. About two
minutes (three with ``--before``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.markdown import table


def _cpu_s(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _rest(server: Any, requests: int) -> None:
    import httpx
    import numpy as np

    from histoserve import wire

    tile = np.zeros((1, 224, 224, 3), np.uint8)
    body, headers = wire.encode_request({"pixels": tile})
    with httpx.Client(base_url=server.base, timeout=30) as client:
        for _ in range(requests):
            client.post("/v2/models/bench/infer", content=body, headers=headers).raise_for_status()


def _grpc(server: Any, requests: int) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        item = grpcclient.InferInput("pixels", [1, 224, 224, 3], "UINT8")
        item.set_data_from_numpy(np.zeros((1, 224, 224, 3), np.uint8))
        for _ in range(requests):
            client.infer("bench", [item])
    finally:
        client.close()


def measure(rounds: int, requests: int, log_dir: Path, before: str | None) -> dict[str, Any]:
    """Per protocol and server: CPU microseconds per request in each round."""
    from bench.servers import launch
    from bench.servers.before import source_tree
    from harness.otlp import OtlpReceiver
    from harness.packages import module_package

    package = module_package("h0-mini", "bench.servers.null_model:build")
    # the traced server exports every 100 ms (the SDK's standard variable; bench_env passes
    # this environment on), so each round's spans leave, and are counted, within it
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"
    receiver = OtlpReceiver(keep=False)
    settings = {
        "model": "bench", "device": "cpu", "max_batch_size": 32, "max_latency_ms": 5.0,
        "max_queue_size": 1024, "workers": 2, "threads": 2, "log_dir": log_dir, "instances": 2,
    }  # fmt: skip
    traced = ("--otel_endpoint", receiver.url, "--otel_sample_ratio", "1")
    started = {
        "off": launch.start_histoserve(package, kind="untraced", **settings),
        "on": launch.start_histoserve(package, kind="traced", extra=traced, **settings),
    }
    if before:
        tree = source_tree(before)
        started["before"] = launch.start_histoserve(package, kind="before", source=tree, **settings)
    servers = launch.wait_all_ready(started)
    names = tuple(servers)
    figures: dict[str, dict[str, list[float]]] = {
        p: {name: [] for name in names} for p in ("rest", "grpc")
    }
    try:
        for name in servers:  # warm both (first requests, the exporter's first POST)
            _rest(servers[name], 50)
            _grpc(servers[name], 50)
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for protocol, send in (("rest", _rest), ("grpc", _grpc)):
                for name in order:
                    pid = servers[name].proc.pid
                    before = _cpu_s(pid)
                    send(servers[name], requests)
                    time.sleep(0.3)  # the exporter's last batch leaves (every 100 ms here)
                    figures[protocol][name].append((_cpu_s(pid) - before) / requests * 1e6)
    finally:
        for server in servers.values():
            server.stop()
        receiver.close()
    return {"figures": figures, "spans_received": receiver.received}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.tracing_cost", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=500, help="requests per round and server")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    parser.add_argument("--before", default=None, help="also this commit's server, untraced")
    args = parser.parse_args(argv)
    from bench.servers.before import checkout_commit

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tracing-cost-") as tmp:
        result = measure(args.rounds, args.requests, Path(tmp), args.before)
    rows = []
    for protocol, by_server in result["figures"].items():
        medians = {name: statistics.median(v) for name, v in by_server.items()}
        rows.append(
            {
                "protocol": protocol,
                "median_us": medians,
                "on_minus_off_us": medians["on"] - medians["off"],
                "off_minus_before_us": medians["off"] - medians["before"]
                if "before" in medians
                else None,
                "rounds_us": by_server,
            }
        )
    record = {
        "commit": checkout_commit(),
        "before": args.before,
        "rounds": args.rounds,
        "requests": args.requests,
        "device": "cpu",
        "seconds": round(time.monotonic() - started, 1),
        "spans_received": result["spans_received"],
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    head = ["protocol", "server", "us CPU/request (median)", "rounds"]
    body = [
        [
            r["protocol"],
            name,
            f"{r['median_us'][name]:.0f}",
            " ".join(f"{v:.0f}" for v in r["rounds_us"][name]),
        ]
        for r in rows
        for name in r["median_us"]
    ]
    print("\n".join(table(head, body)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
