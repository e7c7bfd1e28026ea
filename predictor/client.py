"""A small Python client for histoserve over V2 REST with the binary tensor extension.

Tiles go out as raw bytes (``pixels`` ``UINT8`` or encoded ``tiles``
``BYTES``) and outputs come back as binary tensors: no base64, no JSON
floats. Any V2 client works too (``tritonclient[http,grpc]``); this one needs
only ``httpx`` and ``numpy``.

Example::

    from predictor.client import HistoserveClient
    with HistoserveClient("http://localhost:8080", "h0-mini") as client:
        embeddings = client.infer_pixels(tiles)["embedding"]   # tiles: uint8 [N, 224, 224, 3]
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx
import numpy as np

HEADER = "Inference-Header-Content-Length"
_NUMPY = {"FP32": np.float32, "UINT8": np.uint8, "FP16": np.float16, "INT64": np.int64}


class InferenceError(RuntimeError):
    """The server refused the request; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str, retry_after_s: float | None = None):
        self.status = status
        self.retry_after_s = retry_after_s
        super().__init__(f"HTTP {status}: {message}")


class HistoserveClient:
    """Sends tiles to one model and returns its outputs as numpy arrays.

    Args:
        url: Base URL, e.g. ``http://localhost:8080``.
        model: Model name in URLs (the spec name by default on the server).
        timeout_s: Per-request timeout.
    """

    def __init__(self, url: str, model: str, timeout_s: float = 300.0):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        self._http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s)
        self.model = model

    def __enter__(self) -> HistoserveClient:
        return self

    def __exit__(
        self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]
    ) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def infer_pixels(
        self, tiles: np.ndarray, *, mode: str | None = None, bulk_rna: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Runs raw RGB tiles ``uint8 [N, H, W, 3]`` (the fast path)."""
        tiles = np.ascontiguousarray(tiles, dtype=np.uint8)
        tensors = [("pixels", "UINT8", list(tiles.shape), tiles.tobytes())]
        return self._infer(tensors, mode, bulk_rna)

    def infer_images(
        self,
        images: Sequence[bytes],
        *,
        mode: str | None = None,
        bulk_rna: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """Runs encoded tiles (PNG, JPEG, TIFF bytes)."""
        payload = b"".join(struct.pack("<I", len(img)) + bytes(img) for img in images)
        return self._infer([("tiles", "BYTES", [len(images)], payload)], mode, bulk_rna)

    def metadata(self) -> dict[str, Any]:
        """The model's V2 metadata."""
        return self._get(f"/v2/models/{self.model}")

    def config(self) -> dict[str, Any]:
        """The full spec, provenance and effective batching configuration."""
        return self._get(f"/v2/models/{self.model}/config")

    def _get(self, path: str) -> dict[str, Any]:
        response = self._http.get(path)
        _raise_for_status(response)
        return response.json()

    def _infer(
        self,
        tensors: list[tuple[str, str, list[int], bytes]],
        mode: str | None,
        bulk_rna: np.ndarray | None,
    ) -> dict[str, np.ndarray]:
        if bulk_rna is not None:
            rna = np.ascontiguousarray(bulk_rna, dtype=np.float32)
            tensors.append(("bulk_rna", "FP32", list(rna.shape), rna.tobytes()))
        header: dict[str, Any] = {
            "inputs": [
                {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(b)}}
                for n, d, s, b in tensors
            ],
            "parameters": {"binary_data_output": True, **({"mode": mode} if mode else {})},
        }
        head = json.dumps(header).encode()
        response = self._http.post(
            f"/v2/models/{self.model}/infer",
            content=head + b"".join(b for *_, b in tensors),
            headers={HEADER: str(len(head)), "content-type": "application/octet-stream"},
        )
        _raise_for_status(response)
        return _decode_response(response)


def _raise_for_status(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        message = response.json().get("error", response.text)
    except ValueError:
        message = response.text
    retry = response.headers.get("retry-after")
    raise InferenceError(response.status_code, message, float(retry) if retry else None)


def _decode_response(response: httpx.Response) -> dict[str, np.ndarray]:
    body = response.content
    length = int(response.headers.get(HEADER, len(body)))
    header = json.loads(body[:length])
    offset, outputs = length, {}
    for out in header["outputs"]:
        dtype = _NUMPY[out["datatype"]]
        size = _binary_size(out.get("parameters"))
        if size is None:
            outputs[out["name"]] = np.asarray(out["data"], dtype=dtype).reshape(out["shape"])
            continue
        outputs[out["name"]] = np.frombuffer(
            body, dtype=dtype, count=size // np.dtype(dtype).itemsize, offset=offset
        ).reshape(out["shape"])
        offset += size
    return outputs


def _binary_size(parameters: Mapping[str, Any] | None) -> int | None:
    if not parameters or "binary_data_size" not in parameters:
        return None
    return int(parameters["binary_data_size"])
