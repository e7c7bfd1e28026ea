"""The REST fast path answers ``POST /v2/models/{name}/infer`` byte for byte as FastAPI does.

Two live servers on the same package, ``--rest_fast_path true`` and
``false``, get the same raw HTTP requests; status, headers (all but
``date``, in order) and body must be identical. An in-process test shows the
fast path answers by itself (FastAPI's app behind it is never called) and
hands every other request on with its body intact.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from kserve.model_repository import ModelRepository
from starlette.middleware import Middleware
from timing_asgi import TimingMiddleware

from harness.packages import package_in
from harness.server import Server, start_server
from harness.tiles import b64, encode_png, random_tiles
from predictor.codecs.v2 import parse_binary_body
from predictor.http.app import (
    BodyLimitMiddleware,
    CloseWhileDrainingMiddleware,
    insert_beside_timing,
)
from predictor.http.edge import install_http_handlers
from predictor.kserve.dataplane import HistoDataPlane
from predictor.kserve.fast_infer import FastInferMiddleware, infer_route_model

MAX_BODY = 3_000_000
TILE = 224 * 224 * 3


class Answer(NamedTuple):
    status: int
    headers: list[tuple[str, str]]
    body: bytes


@pytest.fixture(scope="module")
def pair(embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """``{"fast": Server, "slow": Server}``: the same package and flags but the fast path."""
    flags = ("--max_batch_size", "8", "--max_body_bytes", str(MAX_BODY))
    servers: dict[str, Server] = {}
    try:
        for name, on in (("fast", "true"), ("slow", "false")):
            log_dir = tmp_path_factory.mktemp(name)
            servers[name] = start_server(
                embedding_package_dir, log_dir, *flags, "--rest_fast_path", on
            )
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def call(
    server: Server,
    body: bytes | Iterable[bytes],
    headers: dict[str, str] | None = None,
    *,
    path: str | None = None,
    method: str = "POST",
) -> Answer:
    """One request on a fresh connection; chunked when ``body`` is an iterable of parts."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        chunked = not isinstance(body, bytes)
        url = path or f"/v2/models/{server.model_name}/infer"
        headers = {"Host": "histoserve.test", **(headers or {})}  # one Host: same redirects
        conn.request(method, url, body=body, headers=headers, encode_chunked=chunked)
        response = conn.getresponse()
        data = response.read()
        kept = [(k.lower(), v) for k, v in response.getheaders() if k.lower() != "date"]
        return Answer(response.status, kept, data)
    finally:
        conn.close()


def both(pair: dict, body: Any, headers: dict[str, str] | None = None, **kw: Any) -> Answer:
    """The fast server's answer, after checking the slow one gave the very same."""
    parts = list(body) if not isinstance(body, bytes) else None
    fast = call(pair["fast"], iter(parts) if parts else body, headers, **kw)
    slow = call(pair["slow"], iter(parts) if parts else body, headers, **kw)
    assert fast == slow
    return fast


def binary_body(
    header: dict[str, Any], blobs: Iterable[bytes] = ()
) -> tuple[bytes, dict[str, str]]:
    """A V2 binary-extension body: the JSON header, then the raw tensors."""
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head))}


def pixels_body(
    tiles: np.ndarray, rid: str | None = "req-1", **parameters: Any
) -> tuple[bytes, dict[str, str]]:
    """Binary ``pixels``; ``rid`` the request id (``None``: the server makes one up)."""
    raw = tiles.tobytes()
    inp = {"name": "pixels", "shape": list(tiles.shape), "datatype": "UINT8"}
    inp["parameters"] = {"binary_data_size": len(raw)}
    header = {"id": rid, "inputs": [inp], "parameters": parameters}
    return binary_body({k: v for k, v in header.items() if v is not None}, [raw])


def json_tiles(pngs: list[str], **parameters: Any) -> bytes:
    inp = {"name": "tiles", "shape": [len(pngs)], "datatype": "BYTES", "data": pngs}
    return json.dumps({"id": "req-2", "inputs": [inp], "parameters": parameters}).encode()


@pytest.mark.integration
@pytest.mark.parametrize("tiles", [1, 4])
@pytest.mark.parametrize("binary_output", [True, False])
def test_binary_requests_match(pair: dict, tiles: int, binary_output: bool) -> None:
    body, headers = pixels_body(random_tiles(tiles, seed=tiles), binary_data_output=binary_output)
    answer = both(pair, body, headers)
    assert answer.status == 200, answer.body[:300]
    names = [k for k, _ in answer.headers]
    assert ("inference-header-content-length" in names) is binary_output
    assert b'"shape":[%d,1536]' % tiles in answer.body


@pytest.mark.integration
@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/vnd.v2+json",
        None,  # parsed by histoserve's binary parser as plain JSON, not by FastAPI
        "text/plain",
    ],
)
def test_json_requests_match(pair: dict, content_type: str | None) -> None:
    pngs = [b64(encode_png(t)) for t in random_tiles(2, seed=5)]
    headers = {"Content-Type": content_type} if content_type else {}
    for binary_output in (False, True):
        answer = both(pair, json_tiles(pngs, binary_data_output=binary_output), headers)
        assert answer.status == 200, answer.body[:300]


@pytest.mark.integration
def test_the_fast_path_and_fastapi_both_name_the_package(
    pair: dict, embedding_package_dir: Path
) -> None:
    """Issue 33, case 9: every answer's parameters carry the served package's digest."""
    digest = hashlib.sha256(package_in(embedding_package_dir).read_bytes()).hexdigest()
    pngs = [b64(encode_png(t)) for t in random_tiles(2, seed=7)]
    plain = both(pair, json_tiles(pngs), {"Content-Type": "application/json"})
    assert json.loads(plain.body)["parameters"] == {"package_sha256": digest, "jpeg_decode": "cpu"}
    body, headers = pixels_body(random_tiles(1, seed=8), binary_data_output=True)
    binary = both(pair, body, headers)
    length = int(dict(binary.headers)["inference-header-content-length"])
    assert json.loads(binary.body[:length])["parameters"] == {
        "package_sha256": digest,
        "jpeg_decode": "cpu",
    }


@pytest.mark.integration
def test_generated_ids_and_request_headers(pair: dict) -> None:
    body, headers = pixels_body(random_tiles(1, seed=9), rid=None)  # the server makes a uuid
    answers = [
        call(pair[name], body, {**headers, "X-Request-Id": "abc", "X-B3-Traceid": "t"})
        for name in ("fast", "slow")
    ]
    uuid = re.compile(rb'"id":"[0-9a-f-]{36}"')
    assert all(len(uuid.findall(a.body)) == 1 for a in answers)
    fast, slow = (a._replace(body=uuid.sub(b"", a.body)) for a in answers)
    assert fast == slow


@pytest.mark.integration
def test_tritonclient_gets_the_same_embeddings(pair: dict) -> None:
    tiles = random_tiles(3, seed=11)
    results = {}
    for name, server in pair.items():
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            for binary in (True, False):
                inp = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
                inp.set_data_from_numpy(tiles, binary_data=binary)
                out = httpclient.InferRequestedOutput("embedding", binary_data=binary)
                result = client.infer(server.model_name, [inp], outputs=[out], request_id="t")
                results[name, binary] = result.as_numpy("embedding")
        finally:
            client.close()
    for binary in (True, False):
        assert results["fast", binary].shape == (3, 1536)
        np.testing.assert_array_equal(results["fast", binary], results["slow", binary])


def _bad_cases() -> list[tuple[str, bytes, dict[str, str], str | None]]:
    """(case, body, headers, the tile-level wording the 400 must carry or None)."""
    png = encode_png(random_tiles(1, seed=1)[0])
    small = np.zeros((1, 2, 2, 3), np.uint8)
    wrong_shape = pixels_body(small)
    tiles_inp = {"name": "tiles", "shape": [2], "datatype": "BYTES"}
    elements = b"".join(len(b).to_bytes(4, "little") + b for b in (png, b"not a png"))
    bad_png = binary_body(
        {"inputs": [{**tiles_inp, "parameters": {"binary_data_size": len(elements)}}]}, [elements]
    )
    pixels_json = {"name": "pixels", "shape": [1, 2, 2, 3], "datatype": "UINT8", "data": [1] * 12}
    both_inputs = {"inputs": [pixels_json, {**tiles_inp, "shape": [1], "data": [b64(png)]}]}
    fp32 = {"inputs": [{**pixels_json, "datatype": "FP32"}]}
    mode = json.loads(json_tiles([b64(png)], mode="no-such-mode"))
    over_range = {"inputs": [{**pixels_json, "data": [300] * 12}]}
    jh = {"Content-Type": "application/json"}
    return [
        ("pixels shape", *wrong_shape, "input 'pixels' tile 0:"),
        ("undecodable png", *bad_png, "input 'tiles' tile 1:"),
        ("bad base64", json_tiles([b64(png), "@@not base64@@"]), jh, "input 'tiles' tile 1:"),
        ("tiles and pixels", json.dumps(both_inputs).encode(), jh, None),
        ("FP32 pixels", json.dumps(fp32).encode(), jh, None),
        ("UINT8 out of range", json.dumps(over_range).encode(), jh, None),
        ("unknown mode", json.dumps(mode).encode(), jh, None),
        (
            "header past the body",
            wrong_shape[0],
            {"Inference-Header-Content-Length": "99999"},
            None,
        ),
        ("malformed JSON", b'{"inputs": [', jh, None),
        ("no inputs", b"{}", jh, None),
        ("a JSON string", b'"abc"', jh, None),
        ("not UTF-8", b"\xff\xfe{}", jh, None),
        ("empty body", b"", jh, None),
        ("garbage, no content type", b"garbage", {}, None),
    ]


@pytest.mark.integration
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input_answers_match(pair: dict, case: tuple) -> None:
    _, body, headers, wording = case
    answer = both(pair, body, headers)
    assert answer.status == 400, answer
    message = json.loads(answer.body)["error"]
    assert wording is None or message.startswith(wording), message


HOSTILE_HEADER_LENGTHS = {
    "superscript two": "\u00b2".encode("latin-1"),
    "one cubed": "1\u00b3".encode("latin-1"),
    "negative": b"-5",
    "ten thousand digits": b"9" * 10_000,
    "empty": b"",
    "utf-8, not latin-1": "\u2081\u0661".encode(),  # subscript one, Arabic-Indic one
    "lone high bytes": b"\xff\xfe",
}


@pytest.mark.integration
@pytest.mark.parametrize("value", HOSTILE_HEADER_LENGTHS.values(), ids=HOSTILE_HEADER_LENGTHS)
def test_any_header_length_value_is_a_400_naming_the_header(pair: dict, value: bytes) -> None:
    """Fast path on and off, the same 400 (never a 500): the value is read by histoserve.wire."""
    body, _ = pixels_body(random_tiles(1, seed=3))
    answer = both(pair, body, {"Inference-Header-Content-Length": value})  # type: ignore[dict-item]
    assert answer.status == 400, answer
    assert "Inference-Header-Content-Length" in json.loads(answer.body)["error"]


@pytest.mark.integration
def test_unknown_model_other_methods_and_paths_match(pair: dict) -> None:
    body, headers = pixels_body(random_tiles(1, seed=2))
    assert both(pair, body, headers, path="/v2/models/nope/infer").status == 404
    model = pair["fast"].model_name
    assert both(pair, body, headers, path=f"/v2/models/{model}/versions/1/infer").status == 501
    assert both(pair, b"", {}, path=f"/v2/models/{model}/infer", method="GET").status == 405
    assert both(pair, body, headers, path=f"/v2/models/{model}/infer/").status == 307


@pytest.mark.integration
def test_oversize_bodies_are_413_and_chunked_bodies_work(pair: dict) -> None:
    big = b"x" * (MAX_BODY + 1)
    declared = both(pair, big, {"Content-Type": "application/octet-stream"})
    assert declared.status == 413 and b"exceeds the limit" in declared.body
    streamed = both(pair, [big[:500_000], big[500_000:]], {})
    assert streamed.status == 413 and b"streamed request body" in streamed.body
    body, headers = pixels_body(random_tiles(1, seed=3))
    parts = [body[:100], body[100:70_000], body[70_000:]]
    assert both(pair, parts, headers).status == 200


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.integration
def test_metrics_and_access_log_still_count_fast_requests(pair: dict) -> None:
    server = pair["fast"]
    model = server.model_name
    access = f'"POST /v2/models/{model}/infer HTTP/1.1" 200'
    before, lines_before = server.metrics(), server.log().count(access)
    body, headers = pixels_body(random_tiles(2, seed=4))
    for _ in range(3):
        assert call(server, body, headers).status == 200
    after = server.metrics()
    for name in ("request_preprocess_seconds_count", "request_predict_seconds_count"):
        assert _metric(after, name, model_name=model) - _metric(before, name, model_name=model) == 3
    ok = {"model": model, "outcome": "ok"}
    assert (
        _metric(after, "histoserve_tiles_total", **ok)
        - _metric(before, "histoserve_tiles_total", **ok)
        == 6
    )
    assert server.log().count(access) - lines_before == 3


@pytest.mark.integration
def test_startup_log_says_which_path(pair: dict) -> None:
    assert "REST fast path on" in pair["fast"].log()
    assert "REST fast path off" in pair["slow"].log()


def _poll(done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def _drain_answers(server: Server, tiles: np.ndarray) -> Answer:
    """The answer to an infer request sent while ``server`` drains a long request."""
    body, headers = pixels_body(tiles)
    long_body, long_headers = pixels_body(random_tiles(192, seed=6))
    worker = threading.Thread(target=call, args=(server, long_body, long_headers), daemon=True)
    worker.start()
    url = f"{server.base}/metrics"
    # Another process's state: polled, there is no event to wait on.
    _poll(lambda: _metric(httpx.get(url).text, "histoserve_inflight_requests") >= 1)
    assert worker.is_alive(), "the long request finished before the drain began"
    server.proc.send_signal(signal.SIGTERM)
    ready = f"{server.base}/v2/models/{server.model_name}/ready"
    _poll(lambda: httpx.get(ready).status_code != 200)  # the drain has begun
    answer = call(server, body, headers)
    assert worker.is_alive(), "the drain ended before the request was answered"
    worker.join(60)
    return answer


@pytest.mark.integration
def test_draining_answers_match(embedding_package_dir: Path, tmp_path: Path) -> None:
    answers = []
    for on in ("true", "false"):
        flags = ("--max_batch_size", "1", "--max_latency_ms", "0", "--rest_fast_path", on)
        server = start_server(embedding_package_dir, tmp_path / on, *flags)
        try:
            answers.append(_drain_answers(server, random_tiles(1, seed=7)))
        finally:
            assert server.stop() == 0
    assert answers[0] == answers[1]
    assert answers[0].status == 503 and ("connection", "close") in answers[0].headers


async def _asgi(app: Any, method: str, path: str, body: bytes, headers: dict) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.request(method, path, content=body, headers=headers)


def test_the_fast_path_answers_alone_and_passes_the_rest_on_intact() -> None:
    import asyncio

    fastapi_app = FastAPI()  # only its exception handlers are used: histoserve's and KServe's
    install_http_handlers(fastapi_app)
    from kserve.errors import ModelNotFound, model_not_found_handler

    fastapi_app.add_exception_handler(ModelNotFound, model_not_found_handler)
    seen: list[tuple[str, bytes]] = []

    async def behind(scope: dict, receive: Any, send: Any) -> None:  # the rest of the app
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        seen.append((scope["path"], body))
        await JSONResponse({"behind": True})(scope, receive, send)

    middleware = FastInferMiddleware(
        behind, HistoDataPlane(model_registry=ModelRepository(), parse_body=parse_binary_body)
    )

    async def app(scope: dict, receive: Any, send: Any) -> None:
        scope["app"] = fastapi_app  # what FastAPI's __call__ sets before its middlewares
        await middleware(scope, receive, send)

    def run(method: str, path: str, body: bytes = b"{}", **headers: str) -> httpx.Response:
        return asyncio.run(_asgi(app, method, path, body, headers))

    answer = run("POST", "/v2/models/m/infer", b"raw", **{"content-type": "x/y"})
    assert answer.status_code == 404 and answer.json() == {
        "error": "Model with name m does not exist."
    }
    assert seen == []  # answered without the app behind it
    run("POST", "/v2/models/m/versions/1/infer", b"v")
    run("POST", "/v2/models/m/infer", b"{bad json", **{"content-type": "application/json"})
    run("POST", "/v2/models/m/infer", b"")
    run("GET", "/v2/models/m/infer", b"g")
    assert seen == [
        ("/v2/models/m/versions/1/infer", b"v"),
        ("/v2/models/m/infer", b"{bad json"),  # FastAPI's own 400 for it, body replayed
        ("/v2/models/m/infer", b""),
        ("/v2/models/m/infer", b"g"),
    ]


@pytest.mark.parametrize(
    ("method", "path", "name"),
    [
        ("POST", "/v2/models/h0-mini/infer", "h0-mini"),
        ("POST", "/v2/models/a b/infer", "a b"),
        ("GET", "/v2/models/h0-mini/infer", None),
        ("POST", "/v2/models//infer", None),
        ("POST", "/v2/models/a/b/infer", None),
        ("POST", "/v2/models/h0-mini/versions/1/infer", None),
        ("POST", "/v2/models/h0-mini/infer/", None),
        ("POST", "/v1/models/h0-mini:predict", None),
    ],
)
def test_route_recognition(method: str, path: str, name: str | None) -> None:
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    assert infer_route_model(scope) == name


@pytest.mark.parametrize("outside", [True, False])
def test_ours_go_beside_kserve_timing_inside_the_access_logger(outside: bool) -> None:
    class AccessLogger:  # stands for asgi-logger's middleware: outermost, KServe adds it last
        pass

    stack = [Middleware(AccessLogger), Middleware(TimingMiddleware)]
    ours = [Middleware(c) for c in (CloseWhileDrainingMiddleware, BodyLimitMiddleware)]
    ours.append(Middleware(FastInferMiddleware))
    insert_beside_timing(stack, ours, outside=outside)
    drain_limit_fast = [CloseWhileDrainingMiddleware, BodyLimitMiddleware, FastInferMiddleware]
    timing = [TimingMiddleware]
    expected = drain_limit_fast + timing if outside else timing + drain_limit_fast
    assert [m.cls for m in stack] == [AccessLogger, *expected]


def test_rest_fast_path_flag() -> None:
    from predictor.cli import build_parser

    assert build_parser().parse_args([]).rest_fast_path is True
    assert build_parser().parse_args(["--rest_fast_path", "false"]).rest_fast_path is False
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--rest_fast_path", "maybe"])


def test_a_v2_json_tile_costs_what_a_v1_tile_costs(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pins where V2 JSON base64 tiles were twice as dear as V1's: the answer is
    rendered without ``jsonable_encoder`` (a Python walk over each of the 1536
    floats: FastAPI's own rendering, which V1's route never paid), and each
    tile's base64 is decoded once. A real model in process behind the fast path.
    """
    import asyncio
    import base64

    import fastapi.encoders
    from prometheus_client import CollectorRegistry

    from predictor import startup
    from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
    from predictor.model.metrics import create_metrics

    monkeypatch.setattr(
        startup, "create_metrics", lambda name: create_metrics(name, CollectorRegistry())
    )
    config = ModelConfig(model_dir=embedding_package_dir, device="cpu", preprocess_workers=1)
    model = startup.build_model(config, BatchingConfig(), LimitsConfig())
    repository = ModelRepository()
    repository.update(model)
    fastapi_app = FastAPI()
    install_http_handlers(fastapi_app)
    middleware = FastInferMiddleware(
        None, HistoDataPlane(model_registry=repository, parse_body=parse_binary_body)
    )  # type: ignore[arg-type]
    calls = {"jsonable_encoder": 0, "b64decode": 0}

    def spy(module: Any, name: str) -> None:
        real = getattr(module, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    spy(fastapi.encoders, "jsonable_encoder")  # its recursion goes through this name
    spy(base64, "b64decode")

    async def app(scope: dict, receive: Any, send: Any) -> None:
        scope["app"] = fastapi_app
        await middleware(scope, receive, send)

    tiles = [b64(encode_png(t)) for t in random_tiles(2, seed=3)]
    body = {"inputs": [{"name": "tiles", "shape": [2], "datatype": "BYTES", "data": tiles}]}

    async def serve() -> httpx.Response:
        await model.start_batching()
        try:
            return await _asgi(app, "POST", f"/v2/models/{model.name}/infer",
                               json.dumps(body).encode(), {"content-type": "application/json"})  # fmt: skip
        finally:
            await model.drain(5.0)

    try:
        answer = asyncio.run(serve())
    finally:
        model.stop()
    assert answer.status_code == 200, answer.text
    (output,) = answer.json()["outputs"]
    assert output["shape"] == [2, 1536] and len(output["data"]) == 2 * 1536
    assert calls == {"jsonable_encoder": 0, "b64decode": 2}
