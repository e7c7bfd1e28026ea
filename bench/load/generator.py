"""Closed-loop load generator: its own process, asyncio, one JSON job per stdin line.

Run as ``python -m bench.load.generator``; :class:`bench.matrix.cells.LoadClient` drives
it. Each job is one cell: ``C`` concurrent clients, each sending the same
pre-built request, waiting for the answer and sending again, for a warm-up
then a measured window (both bounded in time and in request count). REST
goes through aiohttp (one keep-alive connection per client), gRPC through
``grpc.aio`` with pre-serialised messages. Never imports kserve or predictor
(see :mod:`bench.load.payloads`). Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.load import payloads
from bench.load.probes import Snapshot, snapshot, summarise_window

GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
]


@dataclass
class Record:
    """One finished request: start, end (monotonic seconds), outcome."""

    start: float
    end: float
    status: str


@dataclass
class Job:
    """One cell's load, as sent by the orchestrator (see :class:`bench.matrix.cells.CellSpec`)."""

    protocol: str
    concurrency: int
    tiles: int
    model: str
    http: str
    grpc: str
    tile_size: int
    warmup_s: float
    window_s: float
    drain_s: float
    max_requests: int
    timeout_s: float
    server_pid: int | None = None
    metrics: bool = True
    pace_rps: float | None = None
    """Offered load: the clients together send at most this many requests/s (None: closed loop)."""
    extra: dict[str, Any] = field(default_factory=dict)


_PAYLOADS: dict[tuple[str, str, int, int], payloads.Payload] = {}


def payload_for(job: Job) -> payloads.Payload:
    """The job's request, built once per (protocol, model, tiles, size) and cached."""
    key = (job.protocol, job.model, job.tiles, job.tile_size)
    if key not in _PAYLOADS:
        tiles = payloads.tiles_for(job.protocol, job.tiles, job.tile_size, seed=job.tiles)
        _PAYLOADS[key] = payloads.build_payload(job.protocol, job.model, tiles)
    return _PAYLOADS[key]


Sender = Callable[[], Awaitable[tuple[str, bytes, dict[str, str]]]]


async def _rest_sender(job: Job, payload: payloads.Payload, session: Any) -> Sender:
    url = f"http://{job.http}{payload.path}"

    async def send() -> tuple[str, bytes, dict[str, str]]:
        async with session.post(url, data=payload.body, headers=payload.headers) as resp:
            body = await resp.read()
            return str(resp.status), body, dict(resp.headers)

    return send


def _grpc_sender(channel: Any, payload: payloads.Payload, timeout_s: float) -> Sender:
    import grpc

    call = channel.unary_unary(GRPC_METHOD, request_serializer=None, response_deserializer=None)

    async def send() -> tuple[str, bytes, dict[str, str]]:
        try:
            body = await call(payload.body, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name, b"", {}
        return "200", body, {}

    return send


async def _client(send: Sender, job: Job, deadline: float, records: list[Record]) -> None:
    """One client: send, await, repeat until the deadline or the count.

    With ``job.pace_rps`` each client sends on its own schedule of
    ``concurrency / pace_rps`` seconds a request (never faster; late when the
    server is slower): the same offered load for every server of a comparison.
    """
    interval = job.concurrency / job.pace_rps if job.pace_rps else 0.0
    next_at = time.monotonic() + interval * np.random.default_rng().random()
    while time.monotonic() < deadline and len(records) < job.max_requests:
        if interval:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at + interval, time.monotonic() - interval)
        start = time.monotonic()
        try:
            status, _, _ = await send()
        except (asyncio.TimeoutError, OSError) as exc:
            status = type(exc).__name__
        except Exception as exc:  # aiohttp's errors: record, keep the loop bounded
            status = type(exc).__name__
        records.append(Record(start, time.monotonic(), status))


async def _validate(send: Sender, job: Job) -> list[int]:
    """Sends one request and checks the answer has one row per tile; returns its shape."""
    status, body, headers = await send()
    if status != "200":
        raise RuntimeError(f"{job.protocol}: first request failed with {status}: {body[:300]!r}")
    if job.protocol == "v2-grpc":
        rows, width = payloads.grpc_output_rows(body)
    else:
        rows, width = payloads.rest_output_rows(body, {k.lower(): v for k, v in headers.items()})
    if rows != job.tiles:
        raise RuntimeError(f"{job.protocol}: {rows} output rows for {job.tiles} tiles")
    return [rows, width]


async def _drive(job: Job, send: Sender, session: Any) -> dict[str, Any]:
    shape = await _validate(send, job)
    records: list[Record] = []
    t0 = time.monotonic()
    window_start, window_end = t0 + job.warmup_s, t0 + job.warmup_s + job.window_s
    marks: dict[str, Snapshot] = {}

    async def mark(name: str, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        marks[name] = await snapshot(job, session)

    tasks = [asyncio.ensure_future(_client(send, job, window_end, records))]
    tasks += [
        asyncio.ensure_future(_client(send, job, window_end, records))
        for _ in range(job.concurrency - 1)
    ]
    markers = [
        asyncio.ensure_future(mark("a", window_start)),
        asyncio.ensure_future(mark("b", window_end)),
    ]
    await asyncio.gather(*markers)
    _, pending = await asyncio.wait(tasks, timeout=job.drain_s)
    for task in pending:
        task.cancel()
    result = _stats(job, records, window_start, window_end)
    result.update(summarise_window(marks["a"], marks["b"]))
    result.update(output_shape=shape, unfinished=len(pending), elapsed_s=time.monotonic() - t0)
    return result


def _stats(job: Job, records: list[Record], start: float, end: float) -> dict[str, Any]:
    inside = [r for r in records if start <= r.end <= end]
    ok = [r for r in inside if r.status == "200"]
    errors: dict[str, int] = {}
    for r in inside:
        if r.status != "200":
            errors[r.status] = errors.get(r.status, 0) + 1
    lat = np.array([r.end - r.start for r in ok]) * 1000.0
    window = end - start
    pct = np.percentile(lat, [50, 95, 99]).tolist() if len(lat) else [None] * 3
    return {
        "requests": len(ok),
        "errors": errors,
        "window_s": window,
        "throughput": len(ok) * job.tiles / window,
        "requests_per_s": len(ok) / window,
        "p50_ms": pct[0],
        "p95_ms": pct[1],
        "p99_ms": pct[2],
        "mean_ms": float(lat.mean()) if len(lat) else None,
    }


async def run_job(job: Job) -> dict[str, Any]:
    """Runs one cell and returns its measurements (see :func:`_stats`)."""
    import aiohttp

    payload = payload_for(job)
    connector = aiohttp.TCPConnector(limit=job.concurrency + 2, force_close=False)
    timeout = aiohttp.ClientTimeout(total=job.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if job.protocol != "v2-grpc":
            return await _drive(job, await _rest_sender(job, payload, session), session)
        import grpc

        async with grpc.aio.insecure_channel(job.grpc, options=GRPC_OPTIONS) as channel:
            return await _drive(job, _grpc_sender(channel, payload, job.timeout_s), session)


def main() -> int:
    """Reads jobs (JSON lines) from stdin, answers one JSON line each on stdout."""
    try:
        import uvloop

        runner: Callable[[Any], Any] = uvloop.run
    except ImportError:
        runner = asyncio.run
    for line in sys.stdin:
        if not line.strip():
            continue
        job = Job(**json.loads(line))
        try:
            answer = runner(run_job(job))
        except Exception as exc:
            answer = {"failed": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
