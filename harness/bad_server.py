"""A FAKE V2 REST server on loopback that answers wrong on purpose.

A fake because a misbehaving server cannot be had otherwise: the real
histoserve server answers what it should, and the cases a client must survive
(a bug, a proxy rewriting bodies, another model behind the same URL, a
server echoing the credentials it refused) come from elsewhere. Everything
around it is real: stdlib ``http.server`` on a real socket, real V2 binary
bodies (:mod:`histoserve.wire`), and, when ``upstream`` is given, every GET
(model list, config) and by default every inference answer comes from the
real server behind it, then tampered with:

- ``short``: one row of each output, whatever the tiles sent;
- ``empty``: no outputs at all;
- ``rename``: each output renamed (``embedding`` -> ``embeddings``);
- ``dtype``: float outputs as FP64 (others as INT32);
- ``shape``: the second axis of each output halved (1536 -> 768);
- ``nan``: three values of each float output NaN;
- ``model``: the answer names another model (``model_name``);
- ``package``: the answer names another package (``parameters.package_sha256``;
  untampered answers name the upstream answer's package, else the config's
  ``package_sha256`` (the upstream's config when there is one), as a
  histoserve server does): a replica of another package behind the same URL;
- ``decode``: the answer names the other JPEG decode (``parameters.jpeg_decode``
  ``cpu`` <-> ``device``; untampered answers pass the upstream's on, or
  ``jpeg_decode``'s claim): a replica decoding elsewhere behind the same URL;
- ``503``: 503 with ``Retry-After: 0`` instead of an answer;
- ``huge``: a 512 MiB body of zeros, its size declared (``Content-Length``);
- ``unsized``: the same without a declared size (read until the connection closes);
- ``gzip``: ``Content-Encoding: gzip``, 0.5 MB that inflates to 512 MiB;
- ``drip``: the right answer, one byte every ``drip_s`` seconds;
- ``twice``: each output answered twice, first with NaNs, then right;
- ``strings``, ``bools``: a JSON answer whose FP32 data are numeric strings
  (``"0.51"``) or booleans.

The first ``after`` inference answers are left alone, then at most ``times``
are tampered with (None: all). ``source="pixels"`` answers inference itself
with :func:`pixel_answer`, a deterministic function of each tile's pixels, so
a test computes every tile's right row from tiles it read independently
(``source="mask"``: :func:`pixel_mask`, as a tissue model would);
:class:`Faults` adds random 503s and short answers to it (property tests).
``echo_credentials`` answers 401 with the ``Authorization`` header it got in
the message, as a careless token-checking server would (``echo_after_chars``:
as plain text, after that many filler characters: a message longer than a
client quotes). Every request's headers are recorded (``seen_headers``).
``jpeg_decode`` makes its config and every answer claim that decode (a
``device`` server is a stand-in where no GPU is: the upstream decodes on the CPU).

:class:`harness.bad_grpc.BadGrpcServer` is the gRPC counterpart.
"""

from __future__ import annotations

import json
import random
import socket
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import numpy as np

from harness.hostile_bodies import HUGE_BYTES, Stream, drip, gzip_bomb, zeros
from harness.loopback import LoopbackHTTP
from histoserve import wire

TAMPERS = (
    "none", "short", "empty", "rename", "dtype", "shape", "nan", "model", "package", "decode",
    "503", "huge", "unsized", "gzip", "drip", "twice", "strings", "bools",
)  # fmt: skip
OTHER_PACKAGE = "0" * 64
"""The digest ``package`` answers name."""


def pixel_answer(tiles: np.ndarray, dim: int) -> np.ndarray:
    """float32 ``[N, dim]``: each tile's pixels (flattened, zero-padded to a multiple of
    ``dim``) summed in ``dim`` interleaved groups, divided by 255.

    Integer sums, so the same tile gives bit-identical rows whatever batch it
    came in and whichever process computes it.
    """
    flat = np.asarray(tiles).reshape(len(tiles), -1).astype(np.int64)
    pad = (-flat.shape[1]) % dim
    if pad:
        flat = np.pad(flat, ((0, 0), (0, pad)))
    sums = flat.reshape(len(tiles), -1, dim).sum(axis=1)
    return sums.astype(np.float32) / np.float32(255)


def pixel_mask(tiles: np.ndarray) -> np.ndarray:
    """uint8 ``[N, T, T]``: 1 where a pixel is darker than near-white (``min(rgb) < 220``)."""
    return (np.asarray(tiles).min(axis=-1) < 220).astype(np.uint8)


def tamper(kind: str, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``outputs`` changed as ``kind`` says (see the module docstring; not ``503``)."""
    body_level = ("twice", "strings", "bools")  # the outputs as they are, encoded wrong
    if kind in (
        "none",
        "model",
        "package",
        "decode",
        "huge",
        "unsized",
        "gzip",
        "drip",
        *body_level,
    ):
        return dict(outputs)
    if kind == "short":
        return {k: v[:1] for k, v in outputs.items()}
    if kind == "empty":
        return {}
    if kind == "rename":
        return {k + "s": v for k, v in outputs.items()}
    if kind == "dtype":
        return {
            k: v.astype(np.float64 if v.dtype.kind == "f" else np.int32) for k, v in outputs.items()
        }
    if kind == "shape":
        return {k: v[:, : max(1, v.shape[1] // 2)] if v.ndim > 1 else v for k, v in outputs.items()}
    if kind == "nan":
        out = {}
        for name, values in outputs.items():
            values = np.array(values)
            if values.dtype.kind == "f":
                values.reshape(-1)[:3] = np.nan
            out[name] = values
        return out
    raise ValueError(f"unknown tamper {kind!r}; one of {TAMPERS}")


@dataclass(frozen=True)
class Faults:
    """Random misbehaviour per inference request (seeded): 503s and short answers."""

    p_503: float = 0.0
    p_short: float = 0.0
    seed: int = 0


class BadServer:
    """``http://127.0.0.1:<port>``: a V2 server that misbehaves as told (see the module docstring).

    Args:
        upstream: Base URL of a real server: GETs, and inference when ``source``
            is ``upstream``, are forwarded to it.
        config: Without ``upstream``: the ``/v2/models/{name}/config`` answer
            (its ``name`` is the only model listed).
        source: ``upstream``, ``pixels`` (``embedding``: :func:`pixel_answer` of
            ``dim`` floats) or ``mask`` (``mask``: :func:`pixel_mask`, a tissue model).
        tamper: One of :data:`TAMPERS`.
        after: Inference answers left alone before tampering starts.
        times: Answers tampered with at most (None: every one after ``after``).
        faults: Random 503s / short answers on top.
        echo_credentials: Methods (``GET``, ``POST``) answered 401 with the
            ``Authorization`` header quoted.
        echo_after_chars: None: the 401 is JSON; else plain text with that many
            filler characters before the header.
        dim: Floats per tile of :func:`pixel_answer`.
    """

    def __init__(
        self,
        upstream: str | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        source: str = "upstream",
        tamper: str = "none",
        after: int = 0,
        times: int | None = None,
        faults: Faults = Faults(),
        echo_credentials: Collection[str] = (),
        echo_after_chars: int | None = None,
        dim: int = 1536,
        drip_s: float = 0.25,
        jpeg_decode: str | None = None,
    ):
        if tamper not in TAMPERS or source not in ("upstream", "pixels", "mask"):
            raise ValueError(f"tamper {tamper!r} / source {source!r}")
        self.tamper, self.after, self.times, self.source, self.dim = (
            tamper, after, times, source, dim,
        )  # fmt: skip
        self.config, self.echo = dict(config or {}), frozenset(echo_credentials)
        self.echo_after_chars = echo_after_chars
        self.drip_s, self.jpeg_decode = drip_s, jpeg_decode
        self.bytes_sent = 0  # of streamed (huge, unsized, drip) bodies, before the client left
        self.infer_requests = self.tampered = self.faulted = 0
        self.upstream_package = ""  # the upstream config's digest, once a client asked for it
        self.seen_headers: list[dict[str, str]] = []  # every request's headers, in order
        self._rng, self._faults = random.Random(faults.seed), faults
        self._lock = threading.Lock()
        self._client = httpx.Client(base_url=upstream, timeout=120) if upstream else None
        handler = type("Handler", (_Handler,), {"fake": self})
        self._http = LoopbackHTTP(handler)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return self._http.url

    def set_faults(self, faults: Faults) -> None:
        """Random faults from now on (their own seeded stream), e.g. per property-test example."""
        with self._lock:
            self._rng, self._faults = random.Random(faults.seed), faults

    def stop(self) -> None:
        """Stops serving; closes the upstream client."""
        self._http.stop()
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> BadServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        """A GET: forwarded upstream, else answered from ``config``."""
        if self._client is not None:
            up = self._client.get(path)
            if path.endswith("/config") and up.status_code == 200:
                self.upstream_package = str(up.json().get("package_sha256") or "")
                if self.jpeg_decode is not None:
                    return _json(200, {**up.json(), "jpeg_decode": self.jpeg_decode})
            return up.status_code, {"content-type": up.headers.get("content-type", "")}, up.content
        name = self.config.get("name", "")
        if path == "/v1/models":
            return _json(200, {"models": [name]})
        if path == f"/v2/models/{name}/config":
            return _json(200, self.config)
        return _json(404, {"error": f"no {path}"})

    def infer(
        self, path: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        """An inference POST: decided, answered (upstream or pixels), maybe tampered with."""
        kind = self._decide()
        if kind == "503":
            status, out_headers, data = _json(503, {"error": "busy (on purpose)"})
            return status, {**out_headers, "retry-after": "0"}, data
        answered: Mapping[str, Any] = {}
        if self.source == "pixels":
            outputs = {"embedding": pixel_answer(_pixels(body, headers), self.dim)}
        elif self.source == "mask":
            outputs = {"mask": pixel_mask(_pixels(body, headers))}
        else:
            assert self._client is not None
            forwarded = {k: v for k, v in headers.items() if k.lower() in _FORWARD}
            up = self._client.post(path, content=body, headers=forwarded)
            if up.status_code != 200:
                return up.status_code, {"content-type": "application/json"}, up.content
            outputs, answered = wire.decode_response(up.content, up.headers.get(wire.HEADER))
        changed = tamper(kind, outputs)
        identity = self._identity(kind, path, answered)
        if kind in ("strings", "bools"):
            return _json(
                200, {**identity, "outputs": [_json_tensor(kind, n, v) for n, v in changed.items()]}
            )
        entries = [wire.encode_tensor(n, v) for n, v in changed.items()]
        if kind == "twice":
            entries = [e for n, v in changed.items() for e in _twice(n, v)]
        header = {**identity, "outputs": [e for e, _ in entries]}
        data, out_headers = wire.binary_body(header, [raw for _, raw in entries])
        if kind == "drip":
            return 200, out_headers, Stream(drip(data, self.drip_s), len(data))
        return 200, out_headers, self._oversize(kind, out_headers) or data

    def _oversize(self, kind: str, headers: dict[str, str]) -> Stream | bytes | None:
        """The body the streaming tampers send instead of ``data`` (headers adjusted)."""
        if kind in ("huge", "unsized"):
            headers.pop(wire.HEADER, None)
            return Stream(zeros(HUGE_BYTES), HUGE_BYTES if kind == "huge" else None)
        if kind == "gzip":
            headers.pop(wire.HEADER, None)
            headers["content-encoding"] = "gzip"
            return gzip_bomb()
        return None

    def _identity(self, kind: str, path: str, answered: Mapping[str, Any]) -> dict[str, Any]:
        """The answer's ``model_name`` and ``parameters`` (package, JPEG decode), as ``kind`` says.

        Untampered: the upstream answer's own (``answered``), else the config's package.
        """
        name = path.split("/")[3] if path.count("/") >= 4 else ""
        identity: dict[str, Any] = {"model_name": "another-model" if kind == "model" else name}
        parameters = dict(answered.get("parameters") or {})
        package = parameters.pop("package_sha256", None) or self.config.get("package_sha256")
        package = OTHER_PACKAGE if kind == "package" else package or self.upstream_package
        decode = self.jpeg_decode or parameters.pop("jpeg_decode", None)
        if kind == "decode":
            decode = "cpu" if decode == "device" else "device"
        facts = {"package_sha256": package, "jpeg_decode": decode}
        parameters.update({k: v for k, v in facts.items() if v})
        if parameters:
            identity["parameters"] = parameters
        return identity

    def _decide(self) -> str:
        """What this inference request gets: ``none``, the tamper, or a random fault."""
        with self._lock:
            self.infer_requests += 1
            roll, faults = self._rng.random(), self._faults
            if roll < faults.p_503 + faults.p_short:
                self.faulted += 1
                return "503" if roll < faults.p_503 else "short"
            due = self.infer_requests > self.after and (
                self.times is None or self.tampered < self.times
            )
            if not due or self.tamper == "none":
                return "none"
            self.tampered += 1
            return self.tamper


_FORWARD = {"content-type", wire.HEADER.lower()}


def _twice(name: str, values: np.ndarray) -> list[tuple[dict[str, Any], bytes]]:
    """``name`` encoded twice: first with NaNs (float outputs), then as it is."""
    wrong = tamper("nan", {name: values})[name]
    return [wire.encode_tensor(name, wrong), wire.encode_tensor(name, values)]


def _json_tensor(kind: str, name: str, values: np.ndarray) -> dict[str, Any]:
    """A JSON output whose data are strings (``strings``) or booleans (``bools``) of ``values``."""
    flat = values.reshape(-1).tolist()
    data = [str(v) for v in flat] if kind == "strings" else [bool(v) for v in flat]
    return {
        "name": name,
        "datatype": wire.datatype_of(values),
        "shape": list(values.shape),
        "data": data,
    }


def _json(status: int, payload: object) -> tuple[int, dict[str, str], bytes]:
    return status, {"content-type": "application/json"}, json.dumps(payload).encode()


def _pixels(body: bytes, headers: Mapping[str, str]) -> np.ndarray:
    """The ``pixels`` input of a binary V2 request."""
    lower = {k.lower(): v for k, v in headers.items()}
    header, view, offset = wire.read_header(body, lower.get(wire.HEADER.lower()))
    for entry in header["inputs"]:
        size = entry["parameters"]["binary_data_size"]
        data = wire.binary_slice(view, offset, size)
        offset += size
        if entry["name"] == "pixels":
            return np.frombuffer(data, np.uint8).reshape(entry["shape"])
    raise ValueError("no pixels input")


class _Handler(BaseHTTPRequestHandler):
    """Hands GETs and POSTs to the :class:`BadServer` (``fake``)."""

    fake: BadServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()  # no Nagle: headers and body go out as they are written, no 40 ms stalls
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args: object) -> None:  # quiet: tests read the counters
        return

    def _reply(self, status: int, headers: Mapping[str, str], data: bytes | Stream) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if isinstance(data, bytes):
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if data.length is None:
            self.send_header("connection", "close")  # the body ends when the connection does
            self.close_connection = True
        else:
            self.send_header("content-length", str(data.length))
        self.end_headers()
        try:
            for chunk in data.chunks:
                self.wfile.write(chunk)
                self.wfile.flush()
                with self.fake._lock:
                    self.fake.bytes_sent += len(chunk)
        except OSError:  # the client stopped reading and closed: what the test wants
            self.close_connection = True

    def _echoed(self) -> bool:
        with self.fake._lock:
            self.fake.seen_headers.append(dict(self.headers))
        if self.command not in self.fake.echo:
            return False
        token = self.headers.get("authorization", "")
        after = self.fake.echo_after_chars
        if after is None:
            self._reply(*_json(401, {"error": f"invalid credentials {token!s}"}))
        else:
            text = f"{'.' * after}{token} was refused".encode("latin-1")
            self._reply(401, {"content-type": "text/plain"}, text)
        return True

    def do_GET(self) -> None:
        if not self._echoed():
            self._reply(*self.fake.get(self.path))

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self._echoed():
            return
        self._reply(*self.fake.infer(self.path, body, dict(self.headers)))
