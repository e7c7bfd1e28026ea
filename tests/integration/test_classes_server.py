"""Classes of service on a real server, driven by tritonclient's own ``priority`` and ``timeout``.

The real ``python -m predictor`` serves the demo package through
:mod:`harness.slow_model` (a batch holding a uniform tile sleeps a tenth of
its value in seconds), with one device worker and batches of 4, so a test
holds the device with one slow batch while it queues others behind it.
tritonclient.grpc cannot share this process with kserve: the gRPC call runs
in its own interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness.server import Server, start_server
from harness.tiles import random_tiles

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FLAGS = (
    *("--model_class", "harness.slow_model:UniformTilesSlow", "--model_name", "slow"),
    *("--max_batch_size", "4", "--max_latency_ms", "0", "--instances_per_device", "1"),
    *("--max_queue_delay_ms", "60000"),  # batches of a second here: no age bound in play
)


@pytest.fixture(scope="module")
def server(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    server = start_server(embedding_package_dir, tmp_path_factory.mktemp("classes"), *FLAGS)
    yield server
    server.stop()


def _uniform(n: int, value: int) -> np.ndarray:
    return np.full((n, 224, 224, 3), value, dtype=np.uint8)


def _infer(server: Server, tiles: np.ndarray, **kwargs: object) -> httpclient.InferResult:
    pixels = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
    pixels.set_data_from_numpy(tiles)
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        return client.infer("slow", [pixels], **kwargs)


class _Sent(threading.Thread):
    """One request in its own thread; when it finished and how."""

    def __init__(self, server: Server, tiles: np.ndarray, **kwargs: object) -> None:
        super().__init__(daemon=True)
        self.args, self.kwargs = (server, tiles), kwargs
        self.error: Exception | None = None
        self.done_at = 0.0
        self.start()

    def run(self) -> None:
        try:
            _infer(*self.args, **self.kwargs)
        except Exception as exc:
            self.error = exc
        self.done_at = time.monotonic()

    def result(self) -> _Sent:
        self.join(60)
        return self


def test_interactive_goes_before_earlier_bulk_and_a_timeout_fails_in_the_queue(server):
    """A slow bulk batch holds the device; bulk tiles queue, then an interactive tile and
    an interactive tile with a 100 ms timeout. The timed-out one gets Triton's answer
    (503, "request timeout expired") while the device is still busy; the interactive one
    runs in the next batch, ahead of the bulk tiles queued before it."""
    slow = _Sent(server, _uniform(1, 15), priority=2)  # 1.5 s on the device
    time.sleep(0.5)
    bulk = _Sent(server, _uniform(4, 5), priority=2)  # two batches of 0.5 s behind it
    time.sleep(0.2)
    urgent = _Sent(server, random_tiles(1, seed=3), priority=1)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        _infer(server, random_tiles(1, seed=4), priority=1, timeout=100_000)
    failed_after_s = time.monotonic() - started
    assert err.value.status() == "503"
    assert "request timeout expired" in err.value.message()
    assert "'timeout'" in err.value.message()
    assert failed_after_s < 1.0 and slow.is_alive()  # at its deadline, not once the device freed
    for sent in (slow.result(), bulk.result(), urgent.result()):
        assert sent.error is None, sent.error
    assert urgent.done_at < bulk.done_at


def test_a_priority_past_the_levels_is_a_400_naming_it(server):
    with pytest.raises(InferenceServerException) as err:
        _infer(server, random_tiles(1, seed=5), priority=3)
    assert err.value.status() == "400"
    assert "parameter 'priority'" in err.value.message() and "got 3" in err.value.message()


_GRPC = """
import sys
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

client = grpcclient.InferenceServerClient(sys.argv[1])
pixels = grpcclient.InferInput("pixels", [1, 224, 224, 3], "UINT8")
pixels.set_data_from_numpy(np.random.default_rng(6).integers(0, 256, (1, 224, 224, 3), dtype=np.uint8))
print(client.infer("slow", [pixels], priority=1, timeout=60_000_000).as_numpy("embedding").shape)
try:
    client.infer("slow", [pixels], priority=7)
except InferenceServerException as exc:
    print(exc.status(), exc.message())
"""


def test_grpc_priority_is_read_as_tritonclient_sends_it(server):
    """tritonclient's gRPC priority is a uint64 parameter, which KServe's own reading drops:
    a class past the levels must still be refused by name, an in-range one served."""
    done = subprocess.run(
        [sys.executable, "-c", _GRPC, server.grpc_url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    served, refused = done.stdout.strip().splitlines()
    assert served == "(1, 1536)"
    assert refused.startswith("StatusCode.INVALID_ARGUMENT")
    assert "parameter 'priority'" in refused and "got 7" in refused


def test_every_class_has_its_queue_series(server):
    text = server.metrics()
    for priority in ("1", "2"):
        assert f'histoserve_queue_depth{{model="slow",priority="{priority}"}}' in text
        assert f'histoserve_queue_wait_seconds_count{{model="slow",priority="{priority}"}}' in text
