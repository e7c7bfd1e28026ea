"""Dispatcher + HTTP transport against scripted V2 servers on loopback.

The real histoserve server cannot be told to answer 429, to reset a
connection or to hold one request while others pass, so these tests use a
small scripted HTTP server (stdlib ``http.server``, real sockets, real
``httpx``, real V2 binary bodies). The same behaviours against the real
server (fault-injected 503s, 4xx, two replicas) are in
``tests/integration/test_embed*.py``.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler

import numpy as np
import pytest

from harness.loopback import LoopbackHTTP
from histoserve import wire
from histoserve.remote.dispatch import Dispatcher, RequestFailed, RetryPolicy
from histoserve.remote.http import parse_retry_after
from histoserve.remote.transport import HttpTransport, RecyclePolicy

Action = Callable[["_Handler"], None]


class Scripted:
    """An HTTP server answering each ``/infer`` with the next scripted action (then OK)."""

    def __init__(self, actions: list[str] | None = None):
        self.actions = list(actions or [])
        self.seen: list[str] = []  # one entry per request: the action taken
        self.peers: set[int] = set()
        self.lock = threading.Lock()
        self.hold: threading.Event | None = None
        self.arrived = threading.Event()
        handler = type("H", (_Handler,), {"scripted": self})
        self.http = LoopbackHTTP(handler)

    @property
    def url(self) -> str:
        return self.http.url

    def next_action(self, peer: int) -> str:
        with self.lock:
            action = self.actions.pop(0) if self.actions else "ok"
            self.seen.append(action)
            self.peers.add(peer)
            return action

    def close(self) -> None:
        self.http.stop()


class _Handler(BaseHTTPRequestHandler):
    scripted: Scripted
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        action = self.scripted.next_action(self.client_address[1])
        if action == "hold":
            self.scripted.arrived.set()
            assert self.scripted.hold is not None
            self.scripted.hold.wait(10)
        if action == "reset":  # RST instead of an answer: a replica gone mid-request
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if action.startswith(("503", "429", "400")):
            status, _, retry_after = action.partition(":")
            self._send(
                int(status),
                json.dumps({"error": f"scripted {status}"}).encode(),
                {
                    "content-type": "application/json",
                    **({"retry-after": retry_after} if retry_after else {}),
                },
            )
            return
        self._answer(body)

    def _answer(self, body: bytes) -> None:
        length = int(self.headers[wire.HEADER])
        header = json.loads(body[:length])
        (pixels,) = [i for i in header["inputs"] if i["name"] == "pixels"]
        tiles = np.frombuffer(body, np.uint8, offset=length).reshape(pixels["shape"])
        embedding = tiles.reshape(len(tiles), -1).mean(axis=1, dtype=np.float32)[:, None]
        embedding = np.repeat(embedding, 4, axis=1)
        entry, raw = wire.encode_tensor("embedding", embedding)
        data, headers = wire.binary_body({"outputs": [entry]}, [raw])
        self._send(200, data, headers)

    def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def servers() -> Iterator[list[Scripted]]:
    made: list[Scripted] = []
    yield made
    for server in made:
        server.close()


def _tiles(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)


def _dispatcher(urls: list[str], sleeps: list[float] | None = None, **retry: float) -> Dispatcher:
    recycle = RecyclePolicy(max_requests=1000, max_age_s=60)
    transports = [HttpTransport(u, 10.0, recycle) for u in urls]
    record = sleeps.append if sleeps is not None else (lambda _s: None)
    return Dispatcher(transports, RetryPolicy(**retry), sleep=record, seed=1)


def _expected(tiles: np.ndarray) -> np.ndarray:
    return np.repeat(tiles.reshape(len(tiles), -1).mean(axis=1, dtype=np.float32)[:, None], 4, 1)


def test_answers_come_back_per_request(servers: list[Scripted]) -> None:
    servers.append(Scripted())
    with _dispatcher([servers[0].url]) as dispatcher:
        tiles = _tiles(5, 0)
        out = dispatcher.infer("m", {"pixels": tiles}, {"mode": "embedding"})
    np.testing.assert_array_equal(out["embedding"], _expected(tiles))


def test_request_goes_to_url_with_fewest_in_flight(servers: list[Scripted]) -> None:
    slow, fast = Scripted(["hold"]), Scripted()
    servers += [slow, fast]
    slow.hold = threading.Event()
    with _dispatcher([slow.url, fast.url]) as dispatcher:
        first = threading.Thread(target=dispatcher.infer, args=("m", {"pixels": _tiles(1, 0)}))
        first.start()
        assert slow.arrived.wait(10)
        for seed in range(3):  # the slow URL has one in flight: all go to the other
            dispatcher.infer("m", {"pixels": _tiles(2, seed)})
        slow.hold.set()
        first.join(10)
        stats = dispatcher.stats()
    assert (len(slow.seen), len(fast.seen)) == (1, 3)
    assert stats[slow.url]["sent"] == 1 and stats[fast.url]["sent"] == 3


@pytest.mark.parametrize("failure", ["503", "429", "reset"])
def test_retryable_failure_is_retried_on_another_url(servers: list[Scripted], failure: str) -> None:
    bad, good = Scripted([failure]), Scripted()
    servers += [bad, good]
    tiles = _tiles(3, 1)
    with _dispatcher([bad.url, good.url]) as dispatcher:
        out = dispatcher.infer("m", {"pixels": tiles})
        assert dispatcher.failed_attempts == 1
    np.testing.assert_array_equal(out["embedding"], _expected(tiles))
    assert bad.seen == [failure] and good.seen == ["ok"]


def test_retry_after_is_honoured(servers: list[Scripted]) -> None:
    servers.append(Scripted(["503:0.75", "429:2"]))
    sleeps: list[float] = []
    with _dispatcher([servers[0].url], sleeps) as dispatcher:
        dispatcher.infer("m", {"pixels": _tiles(1, 2)})
    assert len(sleeps) == 2
    assert 0.75 <= sleeps[0] <= 0.85 and 2.0 <= sleeps[1] <= 2.1
    assert servers[0].seen == ["503:0.75", "429:2", "ok"]


def test_client_error_is_not_retried(servers: list[Scripted]) -> None:
    servers.append(Scripted(["400"]))
    with _dispatcher([servers[0].url]) as dispatcher, pytest.raises(RequestFailed) as info:
        dispatcher.infer("m", {"pixels": _tiles(1, 3)})
    assert "HTTP 400" in str(info.value) and "scripted 400" in str(info.value)
    assert servers[0].seen == ["400"]


def test_attempts_are_bounded(servers: list[Scripted]) -> None:
    servers.append(Scripted(["503"] * 10))
    sleeps: list[float] = []
    with (
        _dispatcher([servers[0].url], sleeps, max_attempts=3) as dispatcher,
        pytest.raises(RequestFailed, match=r"failed 3 times.*scripted 503"),
    ):
        dispatcher.infer("m", {"pixels": _tiles(1, 4)})
    assert servers[0].seen == ["503"] * 3
    assert len(sleeps) == 2  # no wait after the last attempt


def test_backoff_is_exponential_with_full_jitter() -> None:
    policy = RetryPolicy(backoff_base_s=0.1, backoff_max_s=1.0)
    rng = random.Random(0)
    for attempt, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        draws = [policy.delay_s(attempt, None, rng) for _ in range(300)]
        assert min(draws) >= 0 and max(draws) <= ceiling
        assert min(draws) < 0.1 * ceiling and max(draws) > 0.9 * ceiling  # the full range


def test_keepalive_connections_are_recycled(servers: list[Scripted]) -> None:
    servers.append(Scripted())
    transport = HttpTransport(servers[0].url, 10.0, RecyclePolicy(max_requests=2, max_age_s=60))
    dispatcher = Dispatcher([transport], RetryPolicy())
    with dispatcher:
        for seed in range(6):
            dispatcher.infer("m", {"pixels": _tiles(1, seed)})
    assert transport.pools_opened == 3
    assert len(servers[0].peers) == 3  # a new TCP connection per pool


def test_connections_are_recycled_by_age(servers: list[Scripted]) -> None:
    servers.append(Scripted())
    transport = HttpTransport(servers[0].url, 10.0, RecyclePolicy(max_requests=100, max_age_s=1e-9))
    with Dispatcher([transport], RetryPolicy()) as dispatcher:
        for seed in range(3):
            dispatcher.infer("m", {"pixels": _tiles(1, seed)})
    assert transport.pools_opened == 3


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3", 3.0),
        ("0.5", 0.5),
        (None, None),
        ("", None),
        (" 2 ", 2.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 30.0),  # an HTTP-date, 30 s after NOW_S
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # already past
        ("Wed, 21 Oct 2015 07:28:00", None),  # no zone: not an HTTP-date
        ("soon", None),
        ("-1", None),
        ("nan", None),
        ("inf", None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, now_s=NOW_S) == expected


NOW_S = 1445412450.0  # Wed, 21 Oct 2015 07:27:30 GMT


def test_policies_validate() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="max_requests"):
        RecyclePolicy(max_requests=0)
    with pytest.raises(ValueError, match="at least one"):
        Dispatcher([], RetryPolicy())


def test_a_failed_url_is_passed_over_for_a_while(servers: list[Scripted]) -> None:
    gone, good = Scripted(["reset"] * 50), Scripted()
    servers += [gone, good]
    with _dispatcher([gone.url, good.url]) as dispatcher:
        for seed in range(10):  # sequential: both URLs have 0 in flight every time
            dispatcher.infer("m", {"pixels": _tiles(1, seed)})
    # Without the cool-down every request would try the gone replica first (ties go to
    # the URL used longest ago); with it, one failure and the rest go elsewhere.
    assert gone.seen == ["reset"] and good.seen == ["ok"] * 10
