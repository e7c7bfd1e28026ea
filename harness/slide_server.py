"""A FAKE slide-head V2 REST server on loopback: gated-attention ABMIL in numpy.

A stand-in for the server side of issue 25 (the ``slide`` family) where the
real one is not there to test against: the contract the client is built on
(one request per slide, ``features`` FP32/FP16 ``[N, D]`` and optional
``coords`` INT64 ``[N, 2]`` in; ``prediction`` FP32 ``[C]``, ``attention``
FP32 ``[N]`` (or ``[N, C]`` with ``branches=True``), ``slide_embedding``
FP32 ``[D]`` out), a config whose spec has ``family: slide``, ``classes``,
``feature_dim`` and modes, and a 400 for features of another width. Real
sockets and real V2 binary bodies (:mod:`histoserve.wire`).

:func:`abmil` is the forward (Ilse et al., 2018, gated attention, seeded
weights), so a test computes the right answer itself. ``tamper``: ``short``
(attention one row short), ``nan``, ``rename`` (``attention`` ->
``attentions``), ``dtype`` (FP64) or ``400``; every request's N, input
names and dtypes are recorded (``seen``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any

import numpy as np

from harness.loopback import LoopbackHTTP
from histoserve import wire
from histoserve.wire.format import DATATYPES

CLASSES = ("benign", "tumour")
DIGEST = "ab" * 32


def weights(dim: int, hidden: int = 16, n_classes: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded ABMIL weights."""
    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(dim)
    return {
        "V": rng.normal(0, scale, (dim, hidden)),
        "U": rng.normal(0, scale, (dim, hidden)),
        "w": rng.normal(0, 1, (hidden, n_classes)),
        "C": rng.normal(0, scale * 4, (dim, n_classes)),
    }


def abmil(features: np.ndarray, w: Mapping[str, np.ndarray], branches: bool = False) -> dict:
    """prediction ``[C]``, attention ``[N]`` (``[N, C]`` with ``branches``), slide_embedding ``[D]``."""
    h = np.asarray(features, np.float64)
    gate = np.tanh(h @ w["V"]) * 0.5 * (1 + np.tanh(h @ w["U"] / 2))  # tanh x sigmoid
    logits = gate @ w["w"]  # [N, C]
    logits = logits if branches else logits[:, :1]
    att = np.exp(logits - logits.max(axis=0))
    att /= att.sum(axis=0)
    pooled = att.T @ h  # [B, D]
    scores = np.einsum("bd,dc->bc", pooled, w["C"])
    scores = np.diagonal(scores) if branches else scores[0]
    prob = np.exp(scores - scores.max())
    prob /= prob.sum()
    return {
        "prediction": prob.astype(np.float32),
        "attention": (att if branches else att[:, 0]).astype(np.float32),
        "slide_embedding": pooled.mean(axis=0).astype(np.float32),
    }


class SlideServer:
    """``http://127.0.0.1:<port>`` serving one fake slide head (see the module docstring)."""

    def __init__(
        self,
        name: str = "abmil-demo",
        dim: int = 16,
        *,
        branches: bool = False,
        tamper: str = "",
        max_tiles: int = 200_000,
        encoder_sha256: str | None = None,
    ):
        self.name, self.dim, self.branches, self.tamper = name, dim, branches, tamper
        self.max_tiles, self.encoder_sha256 = max_tiles, encoder_sha256
        self.w = weights(dim)
        self.seen: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"fake": self})
        self._http = LoopbackHTTP(handler)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return self._http.url

    def config(self) -> dict[str, Any]:
        """The ``/v2/models/{name}/config`` answer."""
        att = [-1, len(CLASSES)] if self.branches else [-1]
        return {
            "name": self.name,
            "package_sha256": DIGEST,
            "spec": {
                "name": self.name,
                "family": "slide",
                "classes": list(CLASSES),
                "feature_dim": self.dim,
                "modes": ["prediction", "embedding", "attention"],
                "tile_encoder": "h0-mini",
                "embedding_dim": self.dim,
            },
            "inputs": [
                {"name": "features", "datatype": "FP32", "shape": [-1, self.dim]},
                {"name": "coords", "datatype": "INT64", "shape": [-1, 2]},
            ],
            "outputs": [
                {"name": "prediction", "datatype": "FP32", "shape": [len(CLASSES)]},
                {"name": "attention", "datatype": "FP32", "shape": att},
                {"name": "slide_embedding", "datatype": "FP32", "shape": [self.dim]},
            ],
            "classes": list(CLASSES),
            "max_tiles_per_slide": self.max_tiles,
            "tile_encoder": {
                "name": "h0-mini",
                "feature_dim": self.dim,
                "package_sha256": self.encoder_sha256,
            },
        }

    def expected(self, features: np.ndarray) -> dict[str, np.ndarray]:
        """What this server answers for ``features`` untampered."""
        return abmil(features, self.w, self.branches)

    def infer(self, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes, dict[str, str]]:
        """One request: 200 with outputs, or a 400."""
        inputs, params = _inputs(body, headers)
        features = inputs.get("features")
        with self._lock:
            self.seen.append(
                {"n": None if features is None else len(features), "params": params,
                 "inputs": {k: str(v.dtype) for k, v in inputs.items()}}
            )  # fmt: skip
        if features is None or features.ndim != 2 or features.shape[1] != self.dim:
            shape = None if features is None else list(features.shape)
            return _error(400, f"features {shape}: this head takes width {self.dim}")
        if self.tamper == "400":
            return _error(400, "refused on purpose")
        asked = str(params.get("mode") or "prediction").split(",")
        tables = wire.SLIDE_MODE_OUTPUTS  # the contract's table, as a server implements it
        wanted = {name for m in asked if m in tables for name in tables[m]}
        answer = {k: v for k, v in self.expected(features).items() if k in wanted}
        outputs = _tampered(self.tamper, answer)
        entries = [wire.encode_tensor(n, v) for n, v in outputs.items()]
        header = {
            "model_name": self.name,
            "parameters": {"package_sha256": DIGEST},  # as every histoserve answer names it
            "outputs": [e for e, _ in entries],
        }
        data, out_headers = wire.binary_body(header, [raw for _, raw in entries])
        return 200, data, out_headers

    def stop(self) -> None:
        """Stops serving."""
        self._http.stop()

    def __enter__(self) -> SlideServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tampered(kind: str, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if kind == "short":
        outputs["attention"] = outputs["attention"][:-1]
    elif kind == "nan":
        outputs["prediction"] = np.full_like(outputs["prediction"], np.nan)
    elif kind == "rename":
        outputs["attentions"] = outputs.pop("attention")
    elif kind == "dtype":
        outputs = {k: v.astype(np.float64) for k, v in outputs.items()}
    return outputs


def _error(status: int, message: str) -> tuple[int, bytes, dict[str, str]]:
    return status, json.dumps({"error": message}).encode(), {"content-type": "application/json"}


def _inputs(body: bytes, headers: Mapping[str, str]) -> tuple[dict[str, np.ndarray], dict]:
    lower = {k.lower(): v for k, v in headers.items()}
    header, view, offset = wire.read_header(body, lower.get(wire.HEADER.lower()))
    out = {}
    for entry in header["inputs"]:
        size = entry["parameters"]["binary_data_size"]
        data = wire.binary_slice(view, offset, size)
        offset += size
        dtype = DATATYPES[entry["datatype"]]
        out[entry["name"]] = np.frombuffer(data, dtype).reshape(entry["shape"])
    return out, dict(header.get("parameters") or {})


class _Handler(BaseHTTPRequestHandler):
    fake: SlideServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        return

    def _reply(self, status: int, data: bytes, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == f"/v2/models/{self.fake.name}/config":
            self._reply(
                200, json.dumps(self.fake.config()).encode(), {"content-type": "application/json"}
            )
        else:
            self._reply(*_error(404, f"no {self.path}"))

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path != f"/v2/models/{self.fake.name}/infer":
            self._reply(*_error(404, f"no {self.path}"))
            return
        self._reply(*self.fake.infer(body, dict(self.headers)))
