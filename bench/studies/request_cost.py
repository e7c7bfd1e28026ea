"""``python -m bench.studies.request_cost``: what one jpeg-transport request may cost the server.

Issue 45's server cases, measured on a loopback server (the tiny demo
``h0-mini``, CPU, 2 stage-1 workers, 2 threads) over REST binary and gRPC:
the largest requests ``--max_request_pixels`` (64 Mi pixels by default)
allows, one normal client request, and the issue's two attacks, against this
checkout's server and, with ``--before COMMIT``, the server at that commit
(the same virtual environment; only ``predictor/`` differs, see
:mod:`bench.servers.before`). Per request and protocol: the answer's status,
its wall time, the server process's CPU seconds (user + system, from
``psutil``) and its peak RSS over the resident size before the request
(``VmHWM`` after resetting it through ``/proc/PID/clear_refs``: the kernel's
own high-water mark, no sampling). Results as JSON (``--out``) and a
Markdown table on stdout: the figures ``docs/reliability.md`` quotes.

Not part of ``make bench``: a few minutes with ``--before`` (the issue's
second attack alone takes a minute of CPU a protocol there), under one
without.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.markdown import table

BEFORE = "f3c29a6"
"""The server before issue 45's bounds (``main`` when the issue was worked)."""
MAX_PX = 4096  # the default --max_image_pixels is 4096 x 4096

Inputs = dict[str, np.ndarray]


@functools.cache
def _jpeg(edge: int, shade: int = 0) -> bytes:
    """A valid flat JPEG of ``edge`` px (Huffman-optimised: 4096 px is about 100 kB)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (edge, edge), (150 + shade % 100, 110, 180)).save(
        out, "JPEG", quality=90, optimize=True
    )
    return out.getvalue()


def _inputs(streams: list[bytes], layout: list[list[int]], boxes: list[list[int]]) -> Inputs:
    tiles = np.empty(len(streams), np.object_)
    tiles[:] = streams
    return {
        "jpeg_boxes": np.asarray(boxes, np.int32).reshape(-1, 4),
        "jpeg_layout": np.asarray(layout, np.int32).reshape(-1, 4),
        "jpeg_tiles": tiles,
    }


def held_at_budget() -> Inputs:
    """Largest held: 4 slide tiles of 4096 px (the budget) stacked under one 4096 px box."""
    full = [0, 0, MAX_PX, MAX_PX]
    return _inputs([_jpeg(MAX_PX, i) for i in range(4)], [full] * 4, [full])


def resized_at_budget() -> Inputs:
    """Largest resize: 2 x 2 slide tiles of 4096 px, 4 boxes of 4096 px across their corners."""
    layout = [[MAX_PX * (i % 2), MAX_PX * (i // 2), MAX_PX, MAX_PX] for i in range(4)]
    half = MAX_PX // 2
    boxes = [[half * (i % 2), half * (i // 2), MAX_PX, MAX_PX] for i in range(4)]
    return _inputs([_jpeg(MAX_PX, i) for i in range(4)], layout, boxes)


def most_pastes() -> Inputs:
    """Most pastes: 1,024 boxes of 128 px, each over 64 of 4,096 slide tiles of 16 px."""
    layout = [[16 * (i % 64), 16 * (i // 64), 16, 16] for i in range(4096)]
    boxes = [[32 * (i % 32), 32 * (i // 32), 128, 128] for i in range(1024)]
    return _inputs([_jpeg(16, i) for i in range(4096)], layout, boxes)


def normal_client() -> Inputs:
    """What ``histoserve embed`` sends for slide A: 64 boxes of 448 px over 256 px slide tiles."""
    from bench.load.payloads import slide_jpeg_inputs

    return slide_jpeg_inputs(64, 448)


def issue_case_1() -> Inputs:
    """Issue 45, case 1: 16 JPEGs each declaring 4096 x 4096 px, stacked under one box."""
    return _inputs(
        [_jpeg(MAX_PX, i) for i in range(16)], [[0, 0, 224, 224]] * 16, [[0, 0, 224, 224]]
    )


def issue_case_2(boxes: int = 256) -> Inputs:
    """Issue 45, case 2: 16 stacked 4096 px slide tiles under ``boxes`` boxes of 4096 px."""
    full = [0, 0, MAX_PX, MAX_PX]
    return _inputs([_jpeg(MAX_PX, i) for i in range(16)], [full] * 16, [full] * boxes)


def pixels_reference() -> Inputs:
    """For comparison: 1,024 raw 224 px tiles (``pixels``), the most a request may carry."""
    return {"pixels": np.zeros((1024, 224, 224, 3), np.uint8)}


REQUESTS: dict[str, Callable[[], Inputs]] = {
    "for comparison: 1024 raw pixel tiles": pixels_reference,
    "at the budget: 4 stacked 4096 px tiles, 1 box": held_at_budget,
    "at the budget: 2x2 4096 px tiles, 4 boxes of 4096 px": resized_at_budget,
    "at the budget: 1024 boxes x 64 slide tiles of 16 px": most_pastes,
    "normal: 64 boxes of 448 px (slide A)": normal_client,
    "issue case 1: 16 x 4096 px stacked, 1 box": issue_case_1,
    "issue case 2: 16 x 4096 px stacked, 256 boxes": issue_case_2,
}


def _server_cost(pid: int, send: Callable[[], str]) -> dict[str, Any]:
    """``send()``'s status, wall s, the server's CPU s and peak RSS over its RSS before (MiB)."""
    import psutil

    proc = psutil.Process(pid)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    rss = proc.memory_info().rss
    cpu = sum(proc.cpu_times()[:2])
    wall = time.perf_counter()
    status = send()
    wall = time.perf_counter() - wall
    cpu = sum(proc.cpu_times()[:2]) - cpu
    hwm = _status_kib(pid, "VmHWM") * 1024
    return {
        "status": status,
        "wall_s": round(wall, 2),
        "server_cpu_s": round(cpu, 2),
        "peak_rss_mib": round((hwm - rss) / 2**20, 1),
    }


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {key}")


def _rest(server: Any, inputs: Inputs) -> Callable[[], str]:
    import httpx

    from histoserve import wire

    body, headers = wire.encode_request(inputs, parameters={"mode": "embedding"})
    url = f"{server.base}/v2/models/{server.model_name}/infer"

    def send() -> str:
        reply = httpx.post(url, content=body, headers=headers, timeout=900, trust_env=False)
        return str(reply.status_code)

    return send


def _grpc(client: Any, model: str, inputs: Inputs) -> Callable[[], str]:
    from harness.grpc_client import GrpcError

    kinds = {
        "jpeg_tiles": "BYTES",
        "jpeg_layout": "INT32",
        "jpeg_boxes": "INT32",
        "pixels": "UINT8",
    }
    typed = {name: (kinds[name], array) for name, array in inputs.items()}

    def send() -> str:
        try:
            client.infer(model, typed, {"mode": "embedding"})
        except GrpcError as exc:
            return exc.status
        return "OK"

    return send


def measure(source: Path | None, version: str, log_dir: Path) -> list[dict[str, Any]]:
    """Every request of :data:`REQUESTS` over REST binary then gRPC, on one fresh server."""
    from bench.servers.launch import start_histoserve
    from harness.grpc_client import GrpcClient
    from harness.packages import demo_package

    package = demo_package("h0-mini")
    server = start_histoserve(
        package, model="h0-mini", device="cpu", max_batch_size=32, max_latency_ms=5,
        max_queue_size=4096, workers=2, threads=2, log_dir=log_dir, source=source,
        kind=f"request-cost-{version}",
    )  # fmt: skip
    rows = []
    try:
        server.wait_ready()
        client = GrpcClient(server.grpc_url)
        try:
            for name, build in REQUESTS.items():
                inputs = build()
                body = sum(len(s) for s in inputs.get("jpeg_tiles", ()))
                for protocol in ("REST", "gRPC"):
                    send = (
                        _rest(server, inputs)
                        if protocol == "REST"
                        else _grpc(client, server.model_name, inputs)
                    )
                    cost = _server_cost(server.proc.pid, send)
                    rows.append(
                        {"server": version, "request": name, "protocol": protocol,
                         "jpeg_bytes": body, **cost}
                    )  # fmt: skip
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            client.close()
    finally:
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--before", default=None, help=f"also measure this commit's server (e.g. {BEFORE})"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="request-cost-") as tmp:
        if args.before:
            from bench.servers.before import source_tree

            rows += measure(source_tree(args.before), args.before, Path(tmp))
        rows += measure(None, "this checkout", Path(tmp))
    if args.out:
        made = {"made_by": "python -m bench.studies.request_cost", "before": args.before}
        from bench.servers.before import checkout_commit

        made["commit"] = checkout_commit()
        args.out.write_text(json.dumps({**made, "rows": rows}, indent=1) + "\n")
    head = ["request", "protocol", "server", "status", "server CPU s", "peak RSS MiB", "wall s"]
    cells = [
        [r["request"], r["protocol"], r["server"], r["status"], r["server_cpu_s"],
         r["peak_rss_mib"], r["wall_s"]]
        for r in rows
    ]  # fmt: skip
    print("\n".join(table(head, cells, left=4)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
