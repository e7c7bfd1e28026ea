"""The client's one core: requests to one served model, retried, and every answer checked.

:class:`HistoserveClient` is what a notebook, ``histoserve embed`` and
``histoserve aggregate`` all send their requests through, in the spirit of
httpx's ``Client(transport=...)``: beneath it one transport per URL (V2 REST
with binary tensors, :class:`~histoserve.remote.transport.HttpTransport`;
V2 gRPC, :class:`~histoserve.remote.grpc_transport.GrpcTransport`; a test's
in-memory one), the :class:`~histoserve.remote.dispatch.Dispatcher`'s choice
of URL and its retries, and the check of every answer against its request
(:class:`~histoserve.remote.answers.AnswerCheck`: outputs, rows, datatype,
shape, finite values, the model and the package that answered). A wrong
answer is a failed attempt, retried like a 503 (elsewhere when there are
several URLs), and never returned.

What an answer must be is read off what the server declares about its model
(``/v2/models/{name}/config`` over HTTP, model metadata over gRPC), fetched
once, on the first request (:attr:`HistoserveClient.info`): a model whose
config lists a ``mask`` output is a tissue model, the others answer what
their mode asks (:mod:`histoserve.wire.modes`). A gRPC server reports no
package digest up front; there the first answer's package is the one every
later answer must name. ``embed`` and ``aggregate`` pass their own checks
(a JPEG transport's decode, a slide head's outputs) to :meth:`HistoserveClient.infer`.

Example::

    from histoserve import HistoserveClient
    with HistoserveClient("http://localhost:8080", "h0-mini") as client:
        embeddings = client.infer_pixels(tiles)["embedding"]   # tiles: uint8 [N, 224, 224, 3]

Any V2 client works too (``tritonclient[http,grpc]``); this one needs only
``httpx`` and ``numpy`` (and ``tritonclient[grpc]``, the ``slides`` extra,
for ``grpc://`` URLs).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx
import numpy as np

from histoserve.errors import BadAnswer, InferenceError
from histoserve.remote.answers import DIGEST_CHARS, AnswerCheck
from histoserve.remote.auth import Credentials, redact_url
from histoserve.remote.dispatch import Check, Dispatcher, RetryPolicy, Transport, make_transport
from histoserve.remote.http import Reply, new_client, parse_retry_after, send
from histoserve.remote.model_config import MAX_CONFIG_BYTES
from histoserve.remote.served_model import ServerInfo, fetch_server_info, info_url
from histoserve.remote.transport import RETRY_STATUS, RecyclePolicy, status_error

__all__ = ["HistoserveClient", "InferenceError"]

SCHEMES = ("http://", "https://", "grpc://", "grpcs://")


class HistoserveClient:
    """Sends tiles to one model and returns its checked outputs as numpy arrays.

    Args:
        url: Base URL (``http(s)://host:port`` or ``grpc(s)://host:port``), or
            several serving the same model package: each request goes to the
            one with the fewest in flight, a failed attempt is retried on another.
        model: Model name in URLs (the spec name by default on the server).
        timeout_s: Whole-request deadline (connect to last byte).
        max_answer_bytes: Larger answers are refused unread (None: what the
            request can need, from the model's outputs).
        credentials: CA bundle, token, headers and proxy use (default: none, no proxy).
        retry: How failed attempts are retried (default: 8 attempts in all,
            the server's ``Retry-After`` honoured, else backoff with jitter).
        recycle: When keep-alive connections are replaced.
        transports: One per URL instead of those the URLs' schemes pick
            (httpx's ``transport=``): tests, a custom network.
        info: The model as already described (``embed`` fetched it): not asked again.
        priority: Every request's class of service (V2 ``priority``: 1 the most
            urgent; 0 or None: the server's default, bulk unless set otherwise).

    Errors: :class:`~histoserve.errors.InferenceError` (the server refused:
    ``status``, the HTTP status or gRPC code, and ``retry_after_s``),
    :class:`~histoserve.errors.RequestFailed` (every attempt failed: the
    network, the deadline, wrong answers; its cause is the last one),
    :class:`~histoserve.errors.UsageError` (URLs serving different packages),
    all :class:`~histoserve.errors.HistoserveError`.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        model: str,
        timeout_s: float = 300.0,
        max_answer_bytes: int | None = None,
        credentials: Credentials | None = None,
        *,
        retry: RetryPolicy | None = None,
        recycle: RecyclePolicy | None = None,
        transports: Sequence[Transport] | None = None,
        info: ServerInfo | None = None,
        priority: int | None = None,
    ):
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("url: give at least one")
        for u in urls:
            if not u.startswith(SCHEMES):
                raise ValueError(
                    "url must start with http://, https://, grpc:// or grpcs://, "
                    f"got {redact_url(u)!r}"
                )
        if not 0 < timeout_s < float("inf"):
            raise ValueError(f"timeout_s must be > 0 and finite, got {timeout_s}")
        if priority is not None and (isinstance(priority, bool) or not 0 <= priority < 2**63):
            raise ValueError(f"priority must be a whole number >= 0, got {priority!r}")
        self._priority = {"priority": int(priority)} if priority else {}
        self.urls = urls
        self.model = model
        self._credentials = credentials or Credentials()
        self._timeout_s, self._cap = timeout_s, max_answer_bytes
        self._retry = retry or RetryPolicy()
        recycle = recycle or RecyclePolicy()
        self._dispatcher = Dispatcher(
            transports
            or [make_transport(u, timeout_s, recycle, self._credentials) for u in self.urls],
            self._retry,
        )
        self._getters: dict[str, httpx.Client] = {}
        self._lock = threading.Lock()  # the GET clients, the first package
        self._info_lock = threading.Lock()  # held while the model is described (GETs in it)
        self._info = info
        self._first_package = ""  # a gRPC server's package, named by its first answer

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
        """Closes every connection pool and channel."""
        self._dispatcher.close()
        with self._lock:
            getters, self._getters = list(self._getters.values()), {}
        for getter in getters:
            getter.close()

    # -- inference -----------------------------------------------------------------------
    def infer_pixels(
        self, tiles: np.ndarray, *, mode: str | None = None, bulk_rna: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Runs raw RGB tiles ``uint8 [N, H, W, 3]`` (the fast path)."""
        return self._tiles({"pixels": np.asarray(tiles, dtype=np.uint8)}, mode, bulk_rna)

    def infer_images(
        self,
        images: Sequence[bytes],
        *,
        mode: str | None = None,
        bulk_rna: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """Runs encoded tiles (PNG, JPEG, TIFF bytes)."""
        encoded = np.empty(len(images), dtype=object)
        encoded[:] = [bytes(img) for img in images]
        return self._tiles({"tiles": encoded}, mode, bulk_rna)

    def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        mode: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        check: Check | None = None,
    ) -> dict[str, np.ndarray]:
        """One request of ``inputs`` (the batch axis first); its answer once it passed ``check``.

        Args:
            inputs: Input tensors by name (``pixels``, ``tiles``, ``bulk_rna``,
                ``jpeg_tiles``, ``features``, ...).
            mode: The request parameter ``mode`` (None: the model's default).
            parameters: Further request parameters.
            check: What the answer must be (None: what :attr:`info` says a
                request of ``mode`` answers, :meth:`AnswerCheck.for_request`).

        Raises:
            InferenceError: The server refused it (4xx), or answered an error on every attempt.
            RequestFailed: Every attempt failed otherwise (the network, wrong answers).
        """
        asked = {**self._priority, **(parameters or {}), **({"mode": mode} if mode else {})}
        if check is None:
            check = self._default_check(mode)
        if self._cap is not None:
            check = _Capped(check, self._cap)
        return self._dispatcher.infer(self.model, inputs, asked, check)

    def _tiles(
        self, inputs: dict[str, np.ndarray], mode: str | None, bulk_rna: np.ndarray | None
    ) -> dict[str, np.ndarray]:
        if bulk_rna is not None:
            inputs["bulk_rna"] = np.asarray(bulk_rna, dtype=np.float32)
        return self.infer(inputs, mode=mode)

    def _default_check(self, mode: str | None) -> Check:
        info = self.info
        check = AnswerCheck.for_request(info, mode)
        if info.reported_sha256:
            return check
        return _FirstPackage(check, self)  # gRPC: the first answer's package, then that one

    def stats(self) -> dict[str, dict[str, int]]:
        """Per URL: requests sent, failed attempts, now in flight."""
        return self._dispatcher.stats()

    # -- what the server says ------------------------------------------------------------
    @property
    def info(self) -> ServerInfo:
        """The model as its servers describe it (asked once, on first use).

        Every URL is asked and must serve the same package
        (:func:`~histoserve.remote.served_model.fetch_server_info`).
        """
        with self._info_lock:
            if self._info is None:
                self._info = fetch_server_info(
                    self.urls,
                    self.model,
                    self._timeout_s,
                    self._retry,
                    credentials=self._credentials,
                    config_of=self._config_at,
                )
            return self._info

    def metadata(self) -> dict[str, Any]:
        """The model's V2 metadata (from the first HTTP URL)."""
        return self._get(self._http_url(), f"/v2/models/{self.model}")

    def config(self) -> dict[str, Any]:
        """The full spec, provenance and effective batching configuration (first HTTP URL)."""
        return self._get(self._http_url(), f"/v2/models/{self.model}/config")

    def _http_url(self) -> str:
        url = info_url(self.urls)
        if url is None:
            raise ValueError("metadata() and config() need an http(s):// URL; gRPC has no config")
        return url.rstrip("/")

    def _config_at(self, url: str, model: str | None) -> tuple[str, Mapping[str, Any]]:
        name = model or self.model
        config = self._get(url, f"/v2/models/{name}/config")
        if not isinstance(config, Mapping):
            raise BadAnswer(f"{url}: the config of {name!r} is not a JSON object")
        return name, config

    def _get(self, url: str, path: str) -> Any:
        """GET ``path`` at ``url`` as JSON: retried like inference, errors as InferenceError."""
        with self._lock:
            getter = self._getters.get(url)
            if getter is None:
                getter = self._getters[url] = new_client(url, self._timeout_s, self._credentials)

        def attempt(_: int) -> Any:
            reply = send(
                getter,
                self._credentials,
                "GET",
                path,
                timeout_s=self._timeout_s,
                max_bytes=MAX_CONFIG_BYTES,
            )
            if reply.status in RETRY_STATUS:
                raise status_error(reply.url, reply, self._credentials)
            _raise_for_status(reply, self._credentials)
            try:
                return reply.json()
            except ValueError as exc:
                raise BadAnswer(f"{reply.url}: not JSON") from exc

        return self._retry.run(attempt, time.sleep, random.Random(), what=f"GET {url}{path}")


@dataclasses.dataclass(frozen=True)
class _Capped:
    """``check`` with answers bounded by the caller's ``max_answer_bytes`` too."""

    check: Check
    cap: int

    def verify(self, answer: Mapping[str, Any], n_tiles: int, url: str) -> None:
        self.check.verify(answer, n_tiles, url)

    def max_answer_bytes(self, n_tiles: int) -> int:
        return min(self.check.max_answer_bytes(n_tiles), self.cap)


@dataclasses.dataclass(frozen=True)
class _FirstPackage:
    """``check``, and every answer naming the package the client's first answer named.

    For servers that report no digest before the first answer (gRPC model
    metadata): replicas of two packages behind one URL are caught at the
    first answer of the second, as embed's config check would catch them.
    """

    check: Check
    client: HistoserveClient

    def verify(self, answer: Mapping[str, Any], n_tiles: int, url: str) -> None:
        self.check.verify(answer, n_tiles, url)
        parameters = (getattr(answer, "identity", None) or {}).get("parameters") or {}
        digest = (
            str(parameters.get("package_sha256") or "") if isinstance(parameters, Mapping) else ""
        )
        if not digest:
            return
        client = self.client
        with client._lock:
            first = client._first_package = client._first_package or digest
        if digest != first:
            raise BadAnswer(
                f"{url}: answered with package {digest[:DIGEST_CHARS]}, not "
                f"{first[:DIGEST_CHARS]} that its first answer named (replicas of two "
                "packages serve it; a wrong answer, not used)"
            )

    def max_answer_bytes(self, n_tiles: int) -> int:
        return self.check.max_answer_bytes(n_tiles)


def _raise_for_status(reply: Reply, credentials: Credentials) -> None:
    if reply.status < 400:
        return
    retry_after_s = parse_retry_after(reply.headers.get("retry-after"))
    message = f"{reply.url}: HTTP {reply.status}: {reply.message(credentials)}"
    raise InferenceError(reply.status, message, retry_after_s)
