"""``--frontends N``: several front-end processes before one device owner, against real servers.

Every server here is the real ``python -m predictor`` on loopback with a
real exported package; the front ends share its ports, tiles cross to the
device owner in shared memory. The answers of two front ends must equal
one process's, tile for tile, over binary REST, gRPC, V1 and V2 JSON; every
promise of one process must hold across processes (a bad tile is a 400 for
its request only, a failed batch a 503 for that batch only, the queue bound
a fast 503, a drain on SIGTERM loses nothing and every process exits 0,
liveness fails once the device owner is gone, ``/metrics`` sums the front
ends).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from harness.grpc_client import GrpcClient
from harness.packages import package_in
from harness.reference import Reference, normalise_reference
from harness.server import Server, start_server
from harness.tiles import b64, encode_png, random_tiles
from harness.waiting import wait_until
from histoserve import wire
from predictor.http.listeners import bind_http

pytestmark = pytest.mark.integration
FLAGS = ("--max_batch_size", "4", "--max_latency_ms", "20", "--fault_injection", "marker:7")
"""Both servers of the comparison; a tile whose pixels are all 7 fails its batch."""
ATOL = 1e-5


@pytest.fixture(scope="module")
def reference(embedding_package_dir: Path) -> Reference:
    return Reference(package_in(embedding_package_dir))


@pytest.fixture(scope="module")
def one(embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One process, as today."""
    server = start_server(
        embedding_package_dir, tmp_path_factory.mktemp("one"), *FLAGS, "--frontends", "1"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def two(embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two front ends and the device owner."""
    server = start_server(
        embedding_package_dir, tmp_path_factory.mktemp("two"), *FLAGS, "--frontends", "2"
    )
    yield server
    server.stop()


def infer_url(server: Server) -> str:
    return f"{server.base}/v2/models/{server.model_name}/infer"


def binary_rest(server: Server, tiles: np.ndarray) -> np.ndarray:
    content, headers = wire.encode_request({"pixels": tiles})
    response = httpx.post(infer_url(server), content=content, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    outputs, _ = wire.decode_response(response.content, response.headers.get(wire.HEADER))
    return outputs["embedding"]


def grpc(server: Server, tiles: np.ndarray) -> np.ndarray:
    client = GrpcClient(server.grpc_url)
    try:
        return client.infer(server.model_name, {"pixels": ("UINT8", tiles)})["embedding"]
    finally:
        client.close()


def v1(server: Server, tiles: np.ndarray) -> np.ndarray:
    instances = [{"image_data": b64(encode_png(t))} for t in tiles]
    url = f"{server.base}/v1/models/{server.model_name}:predict"
    response = httpx.post(url, json={"instances": instances}, timeout=120)
    assert response.status_code == 200, response.text
    return np.asarray([p["output"] for p in response.json()["predictions"]], np.float32)


def v2_json(server: Server, tiles: np.ndarray) -> np.ndarray:
    response = httpx.post(infer_url(server), json=json_body(tiles), timeout=120)
    assert response.status_code == 200, response.text
    (out,) = response.json()["outputs"]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def json_body(tiles: np.ndarray) -> dict:
    data = [b64(encode_png(t)) for t in tiles]
    return {"inputs": [{"name": "tiles", "datatype": "BYTES", "shape": [len(data)], "data": data}]}


def test_front_ends_answer_with_the_owner_s_package(
    two: Server, embedding_package_dir: Path
) -> None:
    """Issue 33, case 9: a front end never loads the package; its answers name the owner's."""
    digest = hashlib.sha256(package_in(embedding_package_dir).read_bytes()).hexdigest()
    tiles = random_tiles(2, seed=21)
    for _ in range(4):  # connections spread over both front ends
        answer = httpx.post(infer_url(two), json=json_body(tiles), timeout=120).json()
        assert answer["parameters"] == {"package_sha256": digest, "jpeg_decode": "cpu"}


@pytest.mark.parametrize("send", [binary_rest, grpc, v1, v2_json], ids=lambda f: f.__name__)
def test_two_front_ends_answer_as_one_process_tile_for_tile(one, two, reference, send):
    tiles = random_tiles(6, seed=11)
    want = reference(normalise_reference(tiles))[0]
    got_one, got_two = send(one, tiles), send(two, tiles)
    assert got_two.shape == got_one.shape == want.shape
    np.testing.assert_allclose(got_two, got_one, atol=ATOL, rtol=ATOL)
    np.testing.assert_allclose(got_two, want, atol=1e-4, rtol=1e-4)


def test_the_logs_are_one_set_tagged_by_process(two):
    binary_rest(two, random_tiles(1, seed=12))
    log = two.log()
    for tag in ("[owner]", "[frontend-0]", "[frontend-1]"):
        assert tag in log, tag
    assert len(frontend_procs(psutil.Process(two.pid))) == 2


def frontend_procs(owner: psutil.Process) -> list[psutil.Process]:
    """The owner's front-end children (not multiprocessing's resource tracker)."""
    found = []
    for proc in owner.children():
        with contextlib.suppress(psutil.Error):  # one just killed: gone, or not yet reaped
            if "--frontend_socket" in proc.cmdline():
                found.append(proc)
    return found


def test_a_bad_tile_is_a_400_for_its_request_only(two, reference):
    good = random_tiles(12, seed=13)
    want = reference(normalise_reference(good))[0]
    png = encode_png(good[0])
    bad = {"inputs": [{"name": "tiles", "datatype": "BYTES", "shape": [2],
                       "data": [b64(png), b64(png[: len(png) // 2])]}]}  # fmt: skip

    def run(i: int) -> tuple[int, httpx.Response]:
        body = bad if i % 3 == 0 else json_body(good[i : i + 1])
        return i, httpx.post(infer_url(two), json=body, timeout=120)

    with cf.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(run, range(12)))
    for i, response in results:
        if i % 3 == 0:
            assert response.status_code == 400, response.text
            assert "tile 1" in response.json()["error"]
            continue
        assert response.status_code == 200, response.text
        (out,) = response.json()["outputs"]
        np.testing.assert_allclose(out["data"], want[i], atol=1e-4, rtol=1e-4)


def test_a_failed_batch_is_a_503_for_that_batch_only(two):
    poison = np.full((1, 224, 224, 3), 7, dtype=np.uint8)
    bodies = [random_tiles(1, seed=20 + i) for i in range(12)]
    bodies.insert(5, poison)

    def run(tiles: np.ndarray) -> httpx.Response:
        content, headers = wire.encode_request({"pixels": tiles})
        return httpx.post(infer_url(two), content=content, headers=headers, timeout=120)

    with cf.ThreadPoolExecutor(13) as pool:
        responses = list(pool.map(run, bodies))
    statuses = [r.status_code for r in responses]
    assert statuses[5] == 503 and "injected" in responses[5].json()["error"]
    assert set(statuses) <= {200, 503}
    assert statuses.count(503) <= 4, f"more failed than one batch of 4 holds: {statuses}"
    assert httpx.get(f"{two.base}/v2/health/live").status_code == 200
    assert httpx.get(f"{two.base}/v2/models/{two.model_name}/ready").status_code == 200


def tiles_ok(metrics: str) -> float:
    match = re.search(r'histoserve_tiles_total\{model="[^"]+",outcome="ok"\} (\S+)', metrics)
    return float(match.group(1)) if match else 0.0


def test_metrics_are_summed_over_the_front_ends(two):
    """Each request and scrape opens its own connection, so the kernel spreads them."""
    before = tiles_ok(two.metrics())
    for i in range(30):
        binary_rest(two, random_tiles(1, seed=100 + i))
    scrapes = [two.metrics() for _ in range(6)]
    assert [tiles_ok(s) for s in scrapes] == [before + 30] * 6
    assert all("histoserve_batch_size_count" in s for s in scrapes)  # the owner's series
    served = set(re.findall(r'\[(frontend-\d)\] [^"]+"POST /v2/models/[^"]+" 200', two.log()))
    assert served == {"frontend-0", "frontend-1"}, "one front end served everything"


def test_a_full_queue_is_a_fast_503(embedding_package_dir, tmp_path):
    """Refused with ``Retry-After`` before stage 1: the refused requests were never decoded."""
    server = start_server(
        embedding_package_dir, tmp_path, "--frontends", "2",
        "--max_batch_size", "1", "--max_queue_size", "2", "--max_latency_ms", "0",
    )  # fmt: skip
    tiles = random_tiles(2, seed=30)

    def run(_: int) -> httpx.Response:
        content, headers = wire.encode_request({"pixels": tiles})
        return httpx.post(infer_url(server), content=content, headers=headers, timeout=120)

    after: list[httpx.Response] = []

    def room_again() -> bool:
        """24 answers in a row are 200s: no front end (either may answer) still thinks it full."""
        after.append(run(len(after)))
        return len(after) >= 24 and all(r.status_code == 200 for r in after[-24:])

    try:
        with cf.ThreadPoolExecutor(32) as pool:
            results = list(pool.map(run, range(96)))
        # A front end hears of the room within STATE_REFRESH_S, when its loop gets to it: wait
        # for the answers to say so (refusals meanwhile are counted below), not a fixed 0.3 s.
        wait_until(room_again, "the front ends to see the room again", interval_s=0.0)
        metrics = server.metrics()
    finally:
        assert server.stop() == 0
    refused = [r for r in results if r.status_code == 503]
    served = [r for r in results if r.status_code == 200]
    assert len(refused) + len(served) == len(results)
    assert refused and served
    assert all("queue full" in r.json()["error"] and r.headers["retry-after"] for r in refused)
    late = [r for r in after if r.status_code != 200]  # refused while a view was stale
    assert all(r.status_code == 503 and "queue full" in r.json()["error"] for r in late)
    refused += late
    served += [r for r in after if r.status_code == 200]
    decoded = re.search(r"histoserve_preprocess_seconds_count\{[^}]*\} (\S+)", metrics)
    sent = len(results) + len(after)
    assert decoded and float(decoded.group(1)) < sent  # some never reached stage 1
    # Every tile in exactly one outcome, whichever process refused it.
    counts = dict(re.findall(r'histoserve_tiles_total\{[^}]*outcome="(\w+)"\} (\S+)', metrics))
    assert float(counts.get("rejected", 0)) == 2 * len(refused), counts
    assert float(counts.get("ok", 0)) == 2 * len(served), counts
    assert float(counts.get("failed", 0)) == 0, counts


def test_sigterm_mid_load_loses_nothing_and_every_process_exits_0(
    embedding_package_dir, tmp_path, reference
):
    server = start_server(embedding_package_dir, tmp_path, "--frontends", "2")
    wait_for_log(server, "front ends serving")  # both front ends are children by now
    children = psutil.Process(server.pid).children()  # front ends and the resource tracker
    tiles = random_tiles(8, seed=40)
    want = reference(normalise_reference(tiles))[0]
    outcomes: list[tuple[str, bool]] = []
    answered: set[int] = set()  # the clients that have had a 200
    stop = threading.Event()

    def client(c: int) -> None:
        while not stop.is_set():
            ids = [c % 8, (c + 1) % 8]
            content, headers = wire.encode_request({"pixels": tiles[ids]})
            try:
                r = httpx.post(infer_url(server), content=content, headers=headers, timeout=60)
            except httpx.HTTPError as exc:
                outcomes.append((f"refused: {type(exc).__name__}", True))
                time.sleep(0.05)
                continue
            if r.status_code == 200:
                got, _ = wire.decode_response(r.content, r.headers.get(wire.HEADER))
                outcomes.append(("ok", np.allclose(got["embedding"], want[ids], atol=1e-4)))
                answered.add(c)
            else:
                message = r.json().get("error", "")
                outcomes.append((message, r.status_code == 503 and "not" in message))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(16)]
    for t in threads:
        t.start()
    try:  # SIGTERM mid-load: once every client has had an answer, not after a fixed 2 s
        wait_until(
            lambda: len(answered) == len(threads),
            "an answer for every client",
            interval_s=0.05,
            detail=server.tail,
        )
    except AssertionError:
        stop.set()
        server.stop()
        raise
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(60)
    stop.set()
    for t in threads:
        t.join()
    assert code == 0, server.tail()
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert all(ok for _, ok in outcomes), [m for m, ok in outcomes if not ok][:5]
    assert sum(m == "ok" for m, _ in outcomes) > 0
    assert re.search(r"\[owner\] device owner stopped \(drained\)", server.log())


def test_a_lost_device_fails_liveness_on_every_front_end(embedding_package_dir, tmp_path):
    """The third batch is a sticky device error; the kubelet's probe may reach either front end."""
    server = start_server(
        embedding_package_dir, tmp_path, "--frontends", "2", "--fault_injection", "fatal:3"
    )
    try:
        for i in range(2):
            binary_rest(server, random_tiles(1, seed=60 + i))
        content, headers = wire.encode_request({"pixels": random_tiles(1, seed=62)})
        fatal = httpx.post(infer_url(server), content=content, headers=headers, timeout=60)
        assert fatal.status_code == 503, fatal.text
        # The kernel hands each new connection to whichever front end accepts first, which
        # may be the same one many times over: probe until both have answered (or 400 probes).
        live, probed = [], set()
        while len(live) < 16 or (probed != {"frontend-0", "frontend-1"} and len(live) < 400):
            live.append(httpx.get(f"{server.base}/v2/health/live", timeout=5))
            probed = set(
                re.findall(r'\[(frontend-\d)\] [^"]+"GET /v2/health/live[^"]*" 503', server.log())
            )
        assert [r.status_code for r in live] == [503] * len(live)
        assert probed == {"frontend-0", "frontend-1"}, "the probes did not reach both front ends"
    finally:
        server.stop()


def test_a_dead_front_end_is_restarted_and_front_ends_die_with_the_owner(
    embedding_package_dir, tmp_path
):
    server = start_server(embedding_package_dir, tmp_path, "--frontends", "2")
    owner = psutil.Process(server.pid)
    wait_for_log(server, "front ends serving")  # a later death is a restart
    frontends = frontend_procs(owner)
    try:
        frontends[0].kill()
        restarted = wait_for_restart(server, owner, gone=frontends[0].pid)
        frontends = frontend_procs(owner)
        assert restarted in {p.pid for p in frontends} and len(frontends) == 2
        binary_rest(server, random_tiles(2, seed=50))  # served, whichever front end answers
        owner.kill()  # as an OOM kill would: no SIGTERM, no drain
        _, alive = psutil.wait_procs(frontends, timeout=10)
        assert not alive, "front ends outlived their supervisor"
        for port in (server.http_port, server.grpc_port):  # nobody holds the ports any more
            bind_http("127.0.0.1", port).close()
    finally:
        for proc in [owner, *frontends]:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        server.proc.wait(30)


def wait_for_log(server: Server, text: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in server.log():
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{server.tail()}"
        time.sleep(0.1)


def wait_for_restart(server: Server, owner: psutil.Process, gone: int) -> int:
    """The pid of the front end started in place of ``gone``, once it has connected."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for proc in frontend_procs(owner):
            log = server.log()
            if f"(pid {proc.pid}) connected" in log and proc.pid not in _first_pids(log):
                return proc.pid
        time.sleep(0.2)
    raise AssertionError(f"no front end restarted in place of {gone}:\n{server.tail()}")


def _first_pids(log: str) -> set[int]:
    """Pids of the front ends that connected at start-up (before ``N front ends serving``)."""
    head = log.split("front ends serving")[0]
    return {int(p) for p in re.findall(r"\(pid (\d+)\) connected", head)}
