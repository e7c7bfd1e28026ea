"""Requests with known answers, over every protocol, for the reliability suites.

Each sender sends one request built from a :class:`TilePool` and returns an
:class:`Outcome`: the status (gRPC codes mapped to their HTTP equivalents),
the message, and whether a 200 carried exactly the embeddings of the tiles
sent, in order. Client ``c`` only ever sends its own tiles, so a response
delivered to the wrong request, or rows out of order, cannot match.

gRPC goes through kserve's own protobuf stubs in this process
(``tritonclient.grpc`` cannot be imported beside kserve).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import numpy as np
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

from harness.reference import Reference, normalise_reference
from harness.server import Server
from harness.tiles import b64, encode_png, random_tiles
from histoserve import wire

ATOL = 1e-4
GRPC_TO_HTTP = {
    "OK": 200,
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 413,
    "UNAVAILABLE": 503,
}
"""gRPC status to the HTTP status of the same row of the error table (others: 500)."""

Answer = tuple[int, str, np.ndarray | None, str | None]
"""What a sender got: status, error message, embeddings (200 only), Retry-After."""


class TilePool:
    """Distinguishable tiles and their true embeddings; client ``c`` owns its own slice.

    Args:
        reference: The package run in the test process.
        clients: How many clients draw from the pool.
        per_client: Tiles owned by each client.
        seed: Seed of the pool's pixels.
    """

    def __init__(self, reference: Reference, clients: int, per_client: int, seed: int = 1000):
        self.clients, self.per_client = clients, per_client
        self.tiles = random_tiles(clients * per_client, seed=seed)
        self.pngs = [encode_png(t) for t in self.tiles]
        chunks = [self.tiles[i : i + 64] for i in range(0, len(self.tiles), 64)]
        self.expected = np.concatenate([reference(normalise_reference(c))[0] for c in chunks])
        self.min_distance = _min_pairwise_distance(self.expected)

    def pick(self, client: int, seq: int, most: int = 3) -> list[int]:
        """1..``most`` of client ``client``'s tiles in a random order fixed by ``seq``."""
        rng = np.random.default_rng((client, seq))
        first = (client % self.clients) * self.per_client
        n = int(rng.integers(1, min(most, self.per_client) + 1))
        return [int(i) for i in rng.permutation(self.per_client)[:n] + first]

    def matches(self, ids: Sequence[int], got: np.ndarray | None) -> bool:
        """True when ``got`` holds exactly the embeddings of ``ids``, in that order."""
        if got is None or got.shape != (len(ids), self.expected.shape[1]):
            return False
        return bool(np.allclose(got, self.expected[list(ids)], atol=ATOL, rtol=ATOL))


def _min_pairwise_distance(rows: np.ndarray) -> float:
    squared = (rows**2).sum(1)
    dist = squared[:, None] + squared[None, :] - 2 * rows @ rows.T
    np.fill_diagonal(dist, np.inf)
    return float(np.sqrt(max(dist.min(), 0.0)))


@dataclass
class Outcome:
    """One request's fate, as the client saw it.

    Attributes:
        kind: Sender name (protocol and validity).
        expect: The status this request should get (200 or 400).
        status: The status it got (gRPC mapped to HTTP); ``None``: no answer.
        correct: For a 200, whether the numbers were this request's own.
        message: The error message, or the exception when there was no answer.
        retry_after: The ``Retry-After`` header of a 503, if any.
        started: ``time.monotonic()`` when the request was sent.
        latency_s: Seconds until the answer (or the failure).
        tiles: Tiles the request carried.
    """

    kind: str
    expect: int
    status: int | None = None
    correct: bool | None = None
    message: str = ""
    retry_after: str | None = None
    started: float = 0.0
    latency_s: float = 0.0
    tiles: int = 0


@dataclass
class Target:
    """A live server and the clients and tiles used to load it."""

    server: Server
    pool: TilePool
    http: httpx.Client
    grpc: RawGrpc

    @property
    def infer_url(self) -> str:
        return f"{self.server.base}/v2/models/{self.server.model_name}/infer"

    @property
    def v1_url(self) -> str:
        return f"{self.server.base}/v1/models/{self.server.model_name}:predict"

    def close(self) -> None:
        self.http.close()
        self.grpc.close()


def make_target(server: Server, pool: TilePool) -> Target:
    """Clients for ``server``: a pooled httpx client and a gRPC channel, both thread-safe."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    http = httpx.Client(timeout=120.0, limits=limits)
    return Target(server, pool, http, RawGrpc(server.grpc_url))


# -- answers ------------------------------------------------------------------------------
def v2_embeddings(response: httpx.Response) -> np.ndarray:
    """The ``embedding`` output of a 200 V2 response, binary or JSON."""
    outputs, _ = wire.decode_response(response.content, response.headers.get(wire.HEADER))
    return outputs["embedding"]


def error_of(response: httpx.Response) -> str:
    """The ``error`` of a JSON error body, else the raw text."""
    try:
        return str(response.json().get("error", response.text))
    except (ValueError, AttributeError):
        return response.text


# -- gRPC ----------------------------------------------------------------------------------
class RawGrpc:
    """A V2 gRPC client on kserve's protobufs; answers ``(code name, details, response)``."""

    def __init__(self, url: str, max_message_bytes: int = 64 << 20):
        options = [("grpc.max_send_message_length", max_message_bytes)]
        options.append(("grpc.max_receive_message_length", max_message_bytes))
        self._channel = grpc.insecure_channel(url, options=options)
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)

    def infer(self, request: pb.ModelInferRequest, timeout_s: float = 60.0) -> tuple[str, str, Any]:
        try:
            return "OK", "", self._stub.ModelInfer(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or "", None

    def close(self) -> None:
        self._channel.close()


def grpc_pixels(model: str, tiles: np.ndarray) -> pb.ModelInferRequest:
    """A gRPC request carrying ``tiles`` as raw ``UINT8`` pixels."""
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="pixels", datatype="UINT8", shape=list(tiles.shape)
    )
    return pb.ModelInferRequest(
        model_name=model, inputs=[tensor], raw_input_contents=[tiles.tobytes()]
    )


def grpc_embeddings(response: Any) -> np.ndarray:
    """The ``embedding`` output of a gRPC response (raw contents)."""
    (out,) = response.outputs
    return np.frombuffer(response.raw_output_contents[0], np.float32).reshape(list(out.shape))


# -- senders: one valid request each, with a known answer ---------------------------------
def _http_answer(
    response: httpx.Response, decode: Callable[[httpx.Response], np.ndarray]
) -> Answer:
    if response.status_code != 200:
        return response.status_code, error_of(response), None, response.headers.get("retry-after")
    return 200, "", decode(response), None


def send_binary_pixels(t: Target, ids: list[int], mode: str | None = None) -> Answer:
    params = {"mode": mode} if mode else None
    content, headers = wire.encode_request({"pixels": t.pool.tiles[ids]}, parameters=params)
    return _http_answer(t.http.post(t.infer_url, content=content, headers=headers), v2_embeddings)


def send_binary_png(t: Target, ids: list[int]) -> Answer:
    content, headers = wire.encode_request({"tiles": [t.pool.pngs[i] for i in ids]})
    return _http_answer(t.http.post(t.infer_url, content=content, headers=headers), v2_embeddings)


def send_json_png(t: Target, ids: list[int]) -> Answer:
    data = [b64(t.pool.pngs[i]) for i in ids]
    body = {"inputs": [{"name": "tiles", "datatype": "BYTES", "shape": [len(ids)], "data": data}]}
    return _http_answer(t.http.post(t.infer_url, json=body), v2_embeddings)


def send_v1_png(t: Target, ids: list[int]) -> Answer:
    instances = [{"image_data": b64(t.pool.pngs[i]), "patch_idx": i} for i in ids]
    response = t.http.post(t.v1_url, json={"instances": instances})
    return _http_answer(response, lambda r: _v1_outputs(r, ids))


def _v1_outputs(response: httpx.Response, ids: list[int]) -> np.ndarray | None:
    predictions = response.json()["predictions"]
    if [p.get("patch_idx") for p in predictions] != ids:
        return None  # metadata echoed to the wrong tile: a mix-up
    return np.asarray([p["output"] for p in predictions], np.float32)


def send_grpc_pixels(t: Target, ids: list[int]) -> Answer:
    request = grpc_pixels(t.server.model_name, t.pool.tiles[ids])
    code, details, response = t.grpc.infer(request)
    if code != "OK":
        return GRPC_TO_HTTP.get(code, 500), f"{code}: {details}", None, None
    return 200, "", grpc_embeddings(response), None


VALID_SENDERS: dict[str, Callable[[Target, list[int]], Answer]] = {
    "v2-binary-pixels": send_binary_pixels,
    "v2-binary-png": send_binary_png,
    "v2-json-png": send_json_png,
    "v1-png": send_v1_png,
    "grpc-pixels": send_grpc_pixels,
}


def send_valid(t: Target, client: int, seq: int, kind: str, most: int = 3) -> Outcome:
    """Sends client ``client``'s request number ``seq`` with sender ``kind``; never raises."""
    ids = t.pool.pick(client, seq, most)
    started = time.monotonic()
    try:
        status, message, got, retry = VALID_SENDERS[kind](t, ids)
    except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
        elapsed = time.monotonic() - started
        error = f"{type(exc).__name__}: {exc}"
        return Outcome(kind, 200, None, None, error, None, started, elapsed, len(ids))
    correct = t.pool.matches(ids, got) if status == 200 else None
    elapsed = time.monotonic() - started
    return Outcome(kind, 200, status, correct, message, retry, started, elapsed, len(ids))


# -- senders: one invalid request each (the server must answer 400) -----------------------
def _bad_base64(t: Target, ids: list[int]) -> httpx.Response:
    body = {"inputs": [{"name": "tiles", "datatype": "BYTES", "shape": [2], "data": ["@@", "x"]}]}
    return t.http.post(t.infer_url, json=body)


def _truncated_png(t: Target, ids: list[int]) -> httpx.Response:
    png = t.pool.pngs[ids[0]]
    content, headers = wire.encode_request({"tiles": [png, png[: len(png) // 3]]})
    return t.http.post(t.infer_url, content=content, headers=headers)


def _v1_unknown_field(t: Target, ids: list[int]) -> httpx.Response:
    instance = {"image_data": b64(t.pool.pngs[ids[0]]), "imagedata": "x"}
    return t.http.post(t.v1_url, json={"instances": [instance]})


def _out_of_range(t: Target, ids: list[int]) -> httpx.Response:
    body = {"inputs": [{"name": "pixels", "datatype": "UINT8", "shape": [1, 1, 1, 3],
                        "data": [1, 2, 256]}]}  # fmt: skip
    return t.http.post(t.infer_url, json=body)


def _malformed_json(t: Target, ids: list[int]) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return t.http.post(t.infer_url, content=b'{"inputs": [{"name"', headers=headers)


def _grpc_short(t: Target, ids: list[int]) -> tuple[int, str]:
    request = grpc_pixels(t.server.model_name, t.pool.tiles[ids])
    request.raw_input_contents[0] = request.raw_input_contents[0][:-1]
    code, details, _ = t.grpc.infer(request)
    return GRPC_TO_HTTP.get(code, 500), f"{code}: {details}"


INVALID_SENDERS: dict[str, Callable[[Target, list[int]], Any]] = {
    "bad-v2-base64": _bad_base64,
    "bad-v2-binary-truncated-png": _truncated_png,
    "bad-v1-unknown-field": _v1_unknown_field,
    "bad-v2-uint8-range": _out_of_range,
    "bad-v2-malformed-json": _malformed_json,
    "bad-grpc-short-raw": _grpc_short,
}


def send_invalid(t: Target, client: int, seq: int, kind: str) -> Outcome:
    """Sends one malformed request of sender ``kind``; never raises."""
    ids = t.pool.pick(client, seq)
    started = time.monotonic()
    try:
        answer = INVALID_SENDERS[kind](t, ids)
    except (httpx.HTTPError, OSError) as exc:
        elapsed = time.monotonic() - started
        return Outcome(
            kind, 400, None, None, f"{type(exc).__name__}: {exc}", None, started, elapsed
        )
    status, message = (
        answer if isinstance(answer, tuple) else (answer.status_code, error_of(answer))
    )
    return Outcome(kind, 400, status, None, message, None, started, time.monotonic() - started)


def mixed_job(t: Target, invalid_share: float = 0.25) -> Callable[[int, int], Outcome]:
    """A load job: each request valid (every protocol in turn) or, at ``invalid_share``, not."""
    valid, invalid = sorted(VALID_SENDERS), sorted(INVALID_SENDERS)

    def job(client: int, seq: int) -> Outcome:
        rng = random.Random(client * 1_000_003 + seq)
        if rng.random() < invalid_share:
            return send_invalid(t, client, seq, rng.choice(invalid))
        return send_valid(t, client, seq, valid[(client + seq) % len(valid)])

    return job
