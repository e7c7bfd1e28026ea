"""A small Python client for histoserve over V2 REST with the binary tensor extension.

Tiles go out as raw bytes (``pixels`` ``UINT8`` or encoded ``tiles``
``BYTES``) and outputs come back as binary tensors: no base64, no JSON
floats. Any V2 client works too (``tritonclient[http,grpc]``); this one needs
only ``httpx`` and ``numpy``.

The V2 binary format itself lives in :mod:`histoserve.wire`, shared with the
benchmark's load generator and the test suites.

Example::

    from histoserve import HistoserveClient
    with HistoserveClient("http://localhost:8080", "h0-mini") as client:
        embeddings = client.infer_pixels(tiles)["embedding"]   # tiles: uint8 [N, 224, 224, 3]
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

import httpx
import numpy as np

from histoserve import wire
from histoserve.remote.retry_after import parse_retry_after


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
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s)
        self.model = model

    def __enter__(self) -> HistoserveClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def infer_pixels(
        self, tiles: np.ndarray, *, mode: str | None = None, bulk_rna: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Runs raw RGB tiles ``uint8 [N, H, W, 3]`` (the fast path)."""
        return self._infer({"pixels": np.asarray(tiles, dtype=np.uint8)}, mode, bulk_rna)

    def infer_images(
        self,
        images: Sequence[bytes],
        *,
        mode: str | None = None,
        bulk_rna: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """Runs encoded tiles (PNG, JPEG, TIFF bytes)."""
        return self._infer({"tiles": [bytes(img) for img in images]}, mode, bulk_rna)

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
        self, inputs: dict[str, wire.Tensor], mode: str | None, bulk_rna: np.ndarray | None
    ) -> dict[str, np.ndarray]:
        if bulk_rna is not None:
            inputs["bulk_rna"] = np.asarray(bulk_rna, dtype=np.float32)
        body, headers = wire.encode_request(inputs, parameters={"mode": mode} if mode else None)
        response = self._http.post(f"/v2/models/{self.model}/infer", content=body, headers=headers)
        _raise_for_status(response)
        outputs, _ = wire.decode_response(response.content, response.headers.get(wire.HEADER))
        return outputs


def _raise_for_status(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        message = response.json().get("error", response.text)
    except ValueError:
        message = response.text
    retry_after_s = parse_retry_after(response.headers.get("retry-after"))
    raise InferenceError(response.status_code, message, retry_after_s)
