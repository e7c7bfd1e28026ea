"""Fault injection: forward failures at a chosen rate fail exactly their batches.

The server runs with the hidden ``--fault_injection nth:K,...`` hook, failing a seeded
random ``RATE`` of the batches of a :class:`Burst` (``first..last``). Requests carry one tile
each, so every request lies in exactly one batch: the 503s must name exactly the
chosen batches that ran, every other request must get its own numbers, and throughput
after the burst must come back to what it was before. A sticky device error
(``fatal:K``) must instead turn liveness false, so Kubernetes restarts the pod.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from harness.server import Server
from tests.reliability.load import (
    LIMITED_FLAGS,
    env_float,
    metric_value,
    record_figures,
    run_clients,
    running,
    summarise,
    target,
)
from tests.reliability.traffic import Outcome, TilePool, send_valid

pytestmark = pytest.mark.integration
RATE = 0.3
CLIENTS = 24


@dataclass(frozen=True)
class Burst:
    """Batches ``first..last`` fail at ``RATE`` (seeded); ``after`` more run afterwards."""

    first: int
    last: int
    after: int

    @property
    def failed(self) -> list[int]:
        span = range(self.first, self.last + 1)
        return sorted(k for k in span if random.Random(k).random() < RATE)

    @property
    def flags(self) -> tuple[str, ...]:
        return (*LIMITED_FLAGS, "--fault_injection", "nth:" + ",".join(map(str, self.failed)))


SHORT, LONG = Burst(30, 80, 40), Burst(40, 1500, 300)


@pytest.fixture(scope="module")
def faulty_server(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with running(embedding_package_dir, tmp_path_factory.mktemp("faults"), *SHORT.flags) as s:
        yield s


def batches(server: Server) -> float:
    return metric_value(server.metrics(), "histoserve_batch_size_count")


def stop_after_batches(server: Server, count: int, stop: threading.Event) -> threading.Thread:
    """A watcher that sets ``stop`` once the server has run ``count`` batches."""

    def watch() -> None:
        while not stop.wait(0.2):
            if batches(server) >= count:
                stop.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def successes_per_s(outcomes: list[Outcome], start: float, end: float) -> float:
    done = [o for o in outcomes if o.status == 200 and start <= o.started + o.latency_s <= end]
    return len(done) / max(end - start, 1e-3)


def named_batches(outcomes: list[Outcome]) -> list[int]:
    found = [re.search(r"injected forward failure in batch (\d+)", o.message) for o in outcomes]
    return [int(m.group(1)) for m in found if m]


def check_throughput_recovers(outcomes: list[Outcome]) -> dict:
    failed = [o for o in outcomes if o.status == 503]
    first = min(o.started for o in failed)
    last = max(o.started + o.latency_s for o in failed)
    begin = min(o.started for o in outcomes)
    end = max(o.started + o.latency_s for o in outcomes)
    before, after = successes_per_s(outcomes, begin, first), successes_per_s(outcomes, last, end)
    assert after >= 0.6 * before, f"throughput {before:.0f}/s before the burst, {after:.0f}/s after"
    return {"ok_per_s_before": round(before), "ok_per_s_after": round(after)}


def run_fault_load(server: Server, pool: TilePool, burst: Burst, duration_s: float) -> dict:
    """Single-tile requests until the burst is over (or the time bound); checks and figures."""
    stop = threading.Event()
    watcher = stop_after_batches(server, burst.last + burst.after, stop)
    kinds = ("v2-binary-pixels", "grpc-pixels")
    with target(server, pool) as t:
        outcomes = run_clients(
            CLIENTS,
            lambda c, s: send_valid(t, c, s, kinds[(c + s) % 2], most=1),
            duration_s=duration_s, max_per_client=100_000, stop=stop,
        )  # fmt: skip
    stop.set()
    watcher.join()
    ran = int(batches(server))
    assert ran >= burst.last + burst.after, f"only {ran} batches ran in {duration_s}s"
    summary = summarise(outcomes, allowed=frozenset({503}))
    assert not summary.lost and not summary.mixed_up and not summary.wrong_status
    failed = [o for o in outcomes if o.status == 503]
    assert sorted(set(named_batches(failed))) == burst.failed, "503s are not the failed batches"
    assert len(named_batches(failed)) == len(failed), [o.message for o in failed][:5]
    metric = metric_value(server.metrics(), "histoserve_tiles_total", outcome="failed")
    assert metric == len(failed), f"server counted {metric} failed tiles, clients saw {len(failed)}"
    return summary.figures() | check_throughput_recovers(outcomes) | {
        "batches": ran, "failed_batches": len(burst.failed), "rate": RATE,
    }  # fmt: skip


def assert_live_and_ready(server: Server) -> None:
    assert httpx.get(f"{server.base}/v2/health/live").status_code == 200
    assert httpx.get(f"{server.base}/v2/models/{server.model_name}/ready").status_code == 200


def test_injected_failures_fail_exactly_their_batches(faulty_server: Server, tile_pool: TilePool):
    result = run_fault_load(faulty_server, tile_pool, SHORT, duration_s=40)
    assert_live_and_ready(faulty_server)
    record_figures("faults", result)


@pytest.mark.slow
def test_injected_failures_long(embedding_package_dir: Path, tmp_path: Path, tile_pool: TilePool):
    with running(embedding_package_dir, tmp_path, *LONG.flags) as server:
        result = run_fault_load(server, tile_pool, LONG, env_float("HISTOSERVE_FAULT_S", 300))
        assert_live_and_ready(server)
    record_figures("faults_long", result)


def test_sticky_device_error_turns_liveness_false(
    embedding_package_dir: Path, tmp_path: Path, tile_pool: TilePool
):
    with running(embedding_package_dir, tmp_path, "--fault_injection", "fatal:3") as server:
        with target(server, tile_pool) as t:
            first = [send_valid(t, 0, s, "v2-binary-pixels", most=1) for s in range(2)]
            assert [o.status for o in first] == [200, 200] and all(o.correct for o in first)
            fatal = send_valid(t, 0, 2, "v2-binary-pixels", most=1)
            assert fatal.status == 503 and "illegal memory access" in fatal.message
            base, name = server.base, server.model_name
            assert httpx.get(f"{base}/v2/health/live").status_code == 503
            assert httpx.get(f"{base}/v2/models/{name}/ready").status_code == 503
            assert httpx.get(f"{base}/v2/health/ready").status_code == 503
            started = time.monotonic()
            after = [
                send_valid(t, 1, s, k, most=1) for s in range(3) for k in ("v1-png", "grpc-pixels")
            ]
            assert {o.status for o in after} == {503}, [o.message for o in after]
            assert time.monotonic() - started < 5.0, "refusals after a device loss must be fast"
        assert server.stop() == 0
