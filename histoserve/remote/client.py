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

import numpy as np

from histoserve import wire
from histoserve.errors import InferenceError
from histoserve.remote.auth import Credentials
from histoserve.remote.http import Reply, new_client, parse_retry_after, send
from histoserve.remote.transport import DEFAULT_MAX_ANSWER_BYTES

__all__ = ["HistoserveClient", "InferenceError"]


class HistoserveClient:
    """Sends tiles to one model and returns its outputs as numpy arrays.

    Args:
        url: Base URL, e.g. ``http://localhost:8080``.
        model: Model name in URLs (the spec name by default on the server).
        timeout_s: Whole-request deadline (connect to last byte).
        max_answer_bytes: Larger answers are refused unread.
        credentials: CA bundle, token, headers and proxy use (default: none, no proxy).

    Errors are :class:`~histoserve.errors.InferenceError` (the server's status
    and message) and :class:`~histoserve.errors.RemoteError` (the network, the
    deadline, an oversized answer).
    """

    def __init__(
        self,
        url: str,
        model: str,
        timeout_s: float = 300.0,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        credentials: Credentials | None = None,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if not 0 < timeout_s < float("inf"):
            raise ValueError(f"timeout_s must be > 0 and finite, got {timeout_s}")
        self._credentials = credentials or Credentials()
        self._http = new_client(url.rstrip("/"), timeout_s, self._credentials)
        self._timeout_s, self._max_bytes = timeout_s, max_answer_bytes
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

    def _send(self, method: str, path: str, **request: Any) -> Reply:
        reply = send(
            self._http,
            self._credentials,
            method,
            path,
            timeout_s=self._timeout_s,
            max_bytes=self._max_bytes,
            **request,
        )
        _raise_for_status(reply, self._credentials)
        return reply

    def _get(self, path: str) -> dict[str, Any]:
        return self._send("GET", path).json()

    def _infer(
        self, inputs: dict[str, wire.Tensor], mode: str | None, bulk_rna: np.ndarray | None
    ) -> dict[str, np.ndarray]:
        if bulk_rna is not None:
            inputs["bulk_rna"] = np.asarray(bulk_rna, dtype=np.float32)
        body, headers = wire.encode_request(inputs, parameters={"mode": mode} if mode else None)
        path = f"/v2/models/{self.model}/infer"
        reply = self._send("POST", path, content=body, headers=headers)
        outputs, _ = wire.decode_response(reply.body, reply.headers.get(wire.HEADER))
        return outputs


def _raise_for_status(reply: Reply, credentials: Credentials) -> None:
    if reply.status < 400:
        return
    retry_after_s = parse_retry_after(reply.headers.get("retry-after"))
    raise InferenceError(reply.status, reply.message(credentials), retry_after_s)
