"""Several models in one server and the model repository extension, on real servers.

A ``--model_dir`` of one folder per model, laid out from the cached demo
packages: ``h0-mini``; ``slow`` (the same package served by
:mod:`harness.slow_model`, its batching set by its own ``histoserve.json``);
``broken`` (a package whose library crashes when loaded,
:mod:`harness.native_crash`, probed by its own settings while the server
probes nothing); ``tissue-seg``; a folder with no package and a file beside
them. The server runs ``--model_control explicit`` with three folders loaded
at start; the repository calls are tritonclient's own (HTTP here, gRPC in
its own interpreter: it cannot share this process with kserve).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness.grpc_client import GrpcClient, GrpcError
from harness.native_crash import misbehaving_model_dir
from harness.packages import copy_package_dir, demo_package
from harness.server import Server, start_server
from harness.tiles import bytes_array, encode_png, random_tiles

pytestmark = pytest.mark.integration

SLOW_SETTINGS = {
    "model_class": "harness.slow_model:UniformTilesSlow",
    "max_batch_size": 4,
    "max_latency_ms": 0,
    "instances_per_device": 1,
    "max_queue_delay_ms": 60000,
    "weight": 2,
}


def _model_dir(root: Path) -> Path:
    h0 = demo_package("h0-mini")
    model_dir = root / "models"
    copy_package_dir(h0, model_dir / "h0-mini")
    copy_package_dir(h0, model_dir / "slow")
    (model_dir / "slow" / "histoserve.json").write_text(json.dumps(SLOW_SETTINGS))
    misbehaving_model_dir(h0.parent, "segv", model_dir / "broken")
    (model_dir / "broken" / "histoserve.json").write_text(json.dumps({"load_probe": "on"}))
    copy_package_dir(demo_package("tissue-seg"), model_dir / "tissue-seg")
    (model_dir / "no-package").mkdir()
    (model_dir / "notes.txt").write_text("not a model")
    return model_dir


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("repository")
    server = start_server(
        _model_dir(root),
        root / "logs",
        *("--model_control", "explicit", "--models", "h0-mini,slow,broken"),
        *("--load_probe", "off", "--instances_per_device", "1"),
        model_name="h0-mini",
    )
    yield server
    server.stop()


def _client(server: Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url, network_timeout=120)


def _index(server: Server) -> dict[str, dict]:
    with _client(server) as client:
        return {row["name"]: row for row in client.get_model_repository_index()}


def _embed(server: Server, model: str, tiles: np.ndarray) -> np.ndarray:
    pixels = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
    pixels.set_data_from_numpy(tiles)
    with _client(server) as client:
        return client.infer(model, [pixels]).as_numpy("embedding")


def test_the_index_lists_every_model_folder_with_its_state_and_memory(server):
    """Each folder with a package is listed; the one whose library crashes in its probe is
    UNAVAILABLE with the reason, while the others serve; memory is measured per model."""
    index = _index(server)
    assert set(index) == {"h0-mini", "slow", "broken", "tissue-seg"}
    assert index["h0-mini"]["state"] == index["slow"]["state"] == "READY"
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "load failed" in index["broken"]["reason"] and "probe" in index["broken"]["reason"]
    assert index["tissue-seg"] == {**index["tissue-seg"], "state": "UNAVAILABLE"}
    assert index["tissue-seg"]["reason"] == "not in --models"
    package = (demo_package("h0-mini")).stat().st_size
    assert index["h0-mini"]["memory_bytes"] >= package
    assert index["tissue-seg"]["memory_bytes"] is None
    assert _embed(server, "h0-mini", random_tiles(2)).shape == (2, 1536)
    metrics = server.metrics()
    assert 'histoserve_model_memory_bytes{model="h0-mini"}' in metrics
    assert 'histoserve_model_memory_bytes{model="tissue-seg"}' not in metrics


def _a_and_b(root: Path, budget: str) -> Server:
    """A server of two copies of one package, ``a`` loaded at start, ``b`` to load."""
    package = demo_package("h0-mini")
    for name in ("a", "b"):
        if not (root / "models" / name).exists():
            copy_package_dir(package, root / "models" / name)
    return start_server(
        root / "models",
        root / f"logs-{budget}",
        *("--model_control", "explicit", "--models", "a", "--memory_budget", budget),
        *("--load_probe", "off", "--instances_per_device", "1"),
        model_name="a",
    )


def test_a_load_is_refused_when_it_and_the_loaded_model_pass_the_budget(tmp_path):
    """Model a is loaded; b alone would fit (its package, even what it measures, is well
    under the budget), but a and b together pass --memory_budget: b's load is refused
    naming what b costs, what each loaded model costs, their sum and the budget, and a
    keeps serving. The budget comes from what this machine measures: a first server runs
    the same steps under the default budget (a at start, then b), and the budget is a's
    cost and half b's."""
    first = _a_and_b(tmp_path, "90%")
    try:
        with _client(first) as client:
            client.load_model("b")
        costs = {name: row["memory_bytes"] for name, row in _index(first).items()}
    finally:
        first.stop()
    budget = costs["a"] + costs["b"] // 2
    assert demo_package("h0-mini").stat().st_size < costs["b"] < budget
    server = _a_and_b(tmp_path, str(budget))
    try:
        with _client(server) as client, pytest.raises(InferenceServerException) as err:
            client.load_model("b")
        message = err.value.message()
        assert err.value.status() == "409"
        found = re.fullmatch(
            r"model 'b' not loaded: it (measured|needs at least \(its package\)) "
            r"(\d+\.\d) MiB, and with the models loaded \(a (\d+\.\d) MiB\) that is "
            r"(\d+\.\d) MiB, over the memory budget of (\d+\.\d) MiB "
            rf"\(--memory_budget {budget}\): unload one first",
            message,
        )
        assert found, message
        b_cost, a_cost, together, said_budget = map(float, found.groups()[1:])
        rows = _index(server)
        mib = 1 << 20
        assert a_cost == round(rows["a"]["memory_bytes"] / mib, 1)
        assert said_budget == round(budget / mib, 1)
        assert b_cost < said_budget < together == pytest.approx(a_cost + b_cost, abs=0.11)
        assert (rows["a"]["state"], rows["b"]["state"]) == ("READY", "UNAVAILABLE")
        assert rows["b"]["reason"] == message and rows["b"]["memory_bytes"] is None
        assert _embed(server, "a", random_tiles(2)).shape == (2, 1536)
        assert 'model="b"' not in server.metrics()
    finally:
        server.stop()


def test_each_model_has_its_own_settings_and_config(server):
    """The slow folder's histoserve.json set its batch bound; h0-mini keeps the server's."""
    slow = httpx.get(f"{server.base}/v2/models/slow/config", timeout=10).json()
    plain = httpx.get(f"{server.base}/v2/models/h0-mini/config", timeout=10).json()
    assert slow["batching"]["max_batch_size"] == 4
    assert plain["batching"]["max_batch_size"] == 32
    assert slow["name"] == "slow"


def test_the_models_take_turns_on_the_one_device(server):
    """One scheduler decides whose batch runs on the shared device: while a slow batch
    (1.5 s) holds it, h0-mini's request waits for its turn instead of running beside it."""
    log = server.log()
    assert "slow: takes turns on device(s) cpu with weight 2" in log
    assert "h0-mini: takes turns on device(s) cpu with weight 1" in log
    done: list[str] = []

    def send(model: str, tiles: np.ndarray) -> None:
        assert _embed(server, model, tiles).shape == (len(tiles), 1536)
        done.append(model)

    slow = threading.Thread(target=send, args=("slow", np.full((1, 224, 224, 3), 15, np.uint8)))
    slow.start()
    time.sleep(0.3)  # the slow batch is on the device
    quick = threading.Thread(target=send, args=("h0-mini", random_tiles(1)))
    quick.start()
    for thread in (slow, quick):
        thread.join(60)
    assert done == ["slow", "h0-mini"]


def _series_of(metrics: str, model: str) -> list[str]:
    """The ``/metrics`` lines of ``model``'s series: histoserve's (``model``) and KServe's
    stage histograms (``model_name``)."""
    return [
        line
        for line in metrics.splitlines()
        if not line.startswith("#")
        and (f'model="{model}"' in line or f'model_name="{model}"' in line)
    ]


def test_load_unload_and_reload(server):
    """An unloaded model's series leave /metrics (every one: a stale queue depth would count
    in every sum over the pod's models); the other models' stay; a reload brings them back."""
    with _client(server) as client:
        client.load_model("tissue-seg")
        assert client.is_model_ready("tissue-seg")
        assert _index(server)["tissue-seg"]["state"] == "READY"
        tile = httpclient.InferInput("pixels", [1, 512, 512, 3], "UINT8")
        tile.set_data_from_numpy(random_tiles(1, size=512))
        client.infer("tissue-seg", [tile])
    loaded = _series_of(server.metrics(), "tissue-seg")
    for name in (
        "histoserve_queue_depth",
        "histoserve_tiles_total",
        "histoserve_device_forwards_total",
        "request_predict_seconds_count",
    ):
        assert any(line.startswith(name) for line in loaded), (name, loaded)
    with _client(server) as client:
        client.unload_model("tissue-seg")
        assert not client.is_model_ready("tissue-seg")
    answer = httpx.post(f"{server.base}/v2/models/tissue-seg/infer", json={"inputs": []})
    assert answer.status_code == 503
    assert "'tissue-seg' is UNAVAILABLE (unloaded)" in answer.json()["error"]
    metrics = server.metrics()
    assert _series_of(metrics, "tissue-seg") == []
    others = _series_of(metrics, "h0-mini")
    assert 'histoserve_queue_depth{model="h0-mini",priority="1"} 0.0' in others
    assert any(line.startswith("histoserve_tiles_total") for line in others)
    with _client(server) as client:
        client.load_model("tissue-seg")
        assert client.is_model_ready("tissue-seg")
    assert 'histoserve_queue_depth{model="tissue-seg",priority="2"} 0.0' in server.metrics()
    assert _embed(server, "h0-mini", random_tiles(1)).shape == (1, 1536)


def test_a_failed_load_says_why_and_leaves_the_others_serving(server):
    with _client(server) as client, pytest.raises(InferenceServerException) as err:
        client.load_model("broken")
    assert err.value.status() == "409"
    assert "'broken' did not load" in err.value.message()
    assert "probe" in err.value.message()
    assert _embed(server, "h0-mini", random_tiles(1)).shape == (1, 1536)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("..", "no path"),
        ("notes.txt", "is a file"),
        ("no-package", "holding no *.pt2"),
        ("absent", "is no model folder"),
        ("a/b", "no path"),
    ],
)
def test_a_bad_name_is_a_400_naming_it(server, name, why):
    with _client(server) as client, pytest.raises(InferenceServerException) as err:
        client.load_model(name)
    assert err.value.status() == "400"
    assert f"model {name!r}" in err.value.message() and why in err.value.message()


def test_an_unload_answers_every_accepted_request(server):
    """A slow batch holds the only device worker and more requests queue behind it; the
    unload refuses new ones (503 naming the state) and answers every one it accepted."""
    results: list[object] = []

    def send(tiles: np.ndarray) -> None:
        try:
            results.append(_embed(server, "slow", tiles).shape)
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=send, args=(np.full((1, 224, 224, 3), 10, np.uint8),))]
    threads += [threading.Thread(target=send, args=(random_tiles(3, seed=i),)) for i in range(4)]
    threads[0].start()
    time.sleep(0.3)  # the slow batch (1 s) is on the device
    for thread in threads[1:]:
        thread.start()
    time.sleep(0.3)  # the others are accepted and queued behind it
    unloading = threading.Thread(target=lambda: _client(server).unload_model("slow"))
    unloading.start()
    time.sleep(0.1)
    refused = httpx.post(f"{server.base}/v2/models/slow/infer", json={"inputs": []})
    assert refused.status_code == 503
    assert "'slow' is UNLOADING" in refused.json()["error"]
    for thread in [*threads, unloading]:
        thread.join(60)
    assert results.count((1, 1536)) == 1 and results.count((3, 1536)) == 4, results
    assert _index(server)["slow"]["state"] == "UNAVAILABLE"


def _thread_niceness(pid: int) -> dict[int, int]:
    """``{thread id: niceness}`` of every thread of process ``pid`` (Linux ``/proc``)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(tid)] = int(stat.rsplit(")", 1)[1].split()[16])
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness: Linux")
def test_a_model_loaded_while_others_serve_keeps_no_thread_at_the_loads_priority(server):
    """A load runs at a lower OS priority than the serving models (so the probe, the
    package's load and the warm-up take what the serving threads leave); the model it
    built then serves at the server's priority: its decode threads, its device worker."""
    with _client(server) as client:
        client.load_model("tissue-seg")
        tiles = httpclient.InferInput("tiles", [2], "BYTES")
        tiles.set_data_from_numpy(bytes_array([encode_png(t) for t in random_tiles(2, 512)]))
        assert client.infer("tissue-seg", [tiles]).as_numpy("mask").shape == (2, 512, 512)
    server_nice = _thread_niceness(server.pid)[server.pid]
    deadline = time.monotonic() + 10
    while True:  # the load's own thread ends just after the load: wait for it, not the model's
        lowered = {t: n for t, n in _thread_niceness(server.pid).items() if n != server_nice}
        if not lowered or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not lowered, f"threads left at the load's priority: {lowered}"


def test_grpc_repository_calls(server):
    grpc = GrpcClient(server.grpc_url)
    try:
        models = {m["name"]: m for m in grpc.repository("index")["models"]}
        assert models["h0-mini"]["state"] == "READY"
        assert models["broken"]["state"] == "UNAVAILABLE"
        with pytest.raises(GrpcError) as err:
            grpc.repository("load", "../h0-mini")
        assert "model '../h0-mini'" in err.value.message
        grpc.repository("unload", "h0-mini")
        grpc.repository("load", "h0-mini")
        assert grpc.is_model_ready("h0-mini")
    finally:
        grpc.close()


def test_a_load_over_the_memory_budget_is_refused_naming_it(tmp_path):
    """Explicit control loads nothing at start unless --models names it (Triton's mode);
    a budget below the package's own size refuses its load before loading anything."""
    model_dir = tmp_path / "models"
    copy_package_dir(demo_package("h0-mini"), model_dir / "h0-mini")
    server = start_server(
        model_dir,
        tmp_path / "logs",
        *("--model_control", "explicit", "--memory_budget", "4000000"),
        wait=False,
    )
    try:
        _wait_live(server)
        with _client(server) as client, pytest.raises(InferenceServerException) as err:
            client.load_model("h0-mini")
        message = err.value.message()
        assert err.value.status() == "409"
        assert message == (
            "model 'h0-mini' not loaded: it needs at least (its package) 4.0 MiB, over the "
            "memory budget of 3.8 MiB (--memory_budget 4000000); no model is loaded"
        )
        assert _index(server)["h0-mini"]["state"] == "UNAVAILABLE"
    finally:
        server.stop()


def _wait_live(server: Server, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.tail()
        try:
            if httpx.get(f"{server.base}/v2/health/live", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # polling a child process: there is no event to wait on
    raise AssertionError(server.tail())


def test_a_one_package_model_dir_lists_its_model_and_refuses_loads(embedding_server):
    """Today's layout is untouched: the index lists its one model, a load says why not."""
    with _client(embedding_server) as client:
        (row,) = client.get_model_repository_index()
        assert (row["name"], row["state"]) == (embedding_server.model_name, "READY")
        with pytest.raises(InferenceServerException) as err:
            client.unload_model(embedding_server.model_name)
    assert err.value.status() == "409" and "holds one package" in err.value.message()
