"""The client's one core: every call to one served model through one ``send``, retried, checked.

:class:`HistoserveClient` is what a notebook, ``histoserve embed`` and
``histoserve aggregate`` all send their requests through, in httpx's shape:
every call (describing the model, listing models, health, tile inference,
tissue masks, slide heads) is a :class:`~histoserve.remote.request.Request`
sent by :meth:`HistoserveClient.send` to one transport per URL (V2 REST with
binary tensors, :class:`~histoserve.remote.transport.HttpTransport`; V2
gRPC, :class:`~histoserve.remote.grpc_transport.GrpcTransport`; a test's
fake given as ``transports=``, which so sees every request, describe
included), through the :class:`~histoserve.remote.dispatch.Dispatcher`'s one
retry loop and choice of URL. Every error is one of
:class:`~histoserve.errors.HistoserveError`'s tree.

The model is described once, on first use, by every URL
(:func:`~histoserve.remote.served_model.describe`: a ``grpc://`` URL as an
``http://`` one), and callers read :attr:`HistoserveClient.info`. Every
inference answer is held to the client's own check
(:meth:`~histoserve.remote.answers.AnswerCheck.for_request`: outputs, rows,
datatype, shape, finite values, the model, and the run's package, pinned to
the reported digest or else the first answer's); a caller's ``check`` (a JPEG
transport's decode, a slide head's outputs) is added to it, never in its
place. A wrong answer is a failed attempt, retried like a 503 (elsewhere when
there are several URLs), and never returned.

Example::

    from histoserve import HistoserveClient
    with HistoserveClient("http://localhost:8080") as client:   # the one model served
        embeddings = client.infer_pixels(tiles)["embedding"]   # tiles: uint8 [N, 224, 224, 3]

Any V2 client works too (``tritonclient[http,grpc]``); this one needs only
``httpx`` and ``numpy`` (and ``tritonclient[grpc]``, the ``slides`` extra,
for ``grpc://`` URLs).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np

from histoserve.errors import InferenceError, UsageError
from histoserve.remote.answers import AllOf, AnswerCheck, Capped, Check, PackagePin
from histoserve.remote.auth import Credentials, redact_url
from histoserve.remote.dispatch import Dispatcher, RetryPolicy, make_transport
from histoserve.remote.request import MAX_CONFIG_BYTES, Request, Transport
from histoserve.remote.served_model import ServerInfo, describe
from histoserve.remote.transport import RecyclePolicy

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
        besides: Models the caller uses for something else (``embed``'s tissue
            model and slide head): with no ``model``, the one model the server
            serves other than these is this client's.

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
        model: str | None = None,
        timeout_s: float = 300.0,
        max_answer_bytes: int | None = None,
        credentials: Credentials | None = None,
        *,
        retry: RetryPolicy | None = None,
        recycle: RecyclePolicy | None = None,
        transports: Sequence[Transport] | None = None,
        info: ServerInfo | None = None,
        priority: int | None = None,
        besides: Collection[str] = (),
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
        self._model = model or (info.model if info is not None else None)
        self._besides = tuple(besides)
        self._credentials = credentials or Credentials()
        self._timeout_s, self._cap = timeout_s, max_answer_bytes
        recycle = recycle or RecyclePolicy()
        self._dispatcher = Dispatcher(
            transports
            or [make_transport(u, timeout_s, recycle, self._credentials) for u in self.urls],
            retry or RetryPolicy(),
        )
        self._info_lock = threading.Lock()  # held while the model is described
        self._info = info
        self._config: dict[str, Any] = {}
        self._pin = PackagePin(info.reported_sha256 if info is not None else "")

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

    @property
    def model(self) -> str:
        """The model's name: as given, else the one model the servers serve (described)."""
        return self._model if self._model is not None else self.info.model

    # -- the one send ----------------------------------------------------------------------
    def send(self, request: Request, check: Check | None = None, url: str | None = None) -> Any:
        """``request``'s answer through the one retry loop (any kind, any URL).

        Args:
            request: What to send.
            check: What an ``infer`` answer must be (the caller's; the client's
                own is added by :meth:`infer`).
            url: Only this URL (describing each one); None: the least busy.

        Raises:
            InferenceError: The server refused it (4xx), or answered an error on every attempt.
            RequestFailed: Every attempt failed otherwise (the network, wrong answers).
        """
        return self._dispatcher.send(request, check, url)

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
        """One request of ``inputs`` (the batch axis first); its answer once it passed every check.

        Args:
            inputs: Input tensors by name (``pixels``, ``tiles``, ``bulk_rna``,
                ``jpeg_tiles``, ``features``, ...).
            mode: The request parameter ``mode`` (None: the model's default).
            parameters: Further request parameters.
            check: What the answer must be besides the client's own check
                (:meth:`AnswerCheck.for_request` of :attr:`info`, with the run's
                package pin), which always applies; a slide head's outputs
                need one (:func:`~histoserve.heads.head.head_check`).

        Raises:
            UsageError: A slide head asked without a check of its outputs.
            InferenceError: The server refused it (4xx), or answered an error on every attempt.
            RequestFailed: Every attempt failed otherwise (the network, wrong answers).
        """
        asked = {**self._priority, **(parameters or {}), **({"mode": mode} if mode else {})}
        if self.info.takes_features and check is None:
            raise UsageError(
                f"model {self.model!r} is a slide head (it takes 'features'): run it with "
                "histoserve.aggregate (or pass its check, histoserve.heads.head.head_check)"
            )
        checks: list[Check] = [AnswerCheck.for_request(self.info, mode, self._pin)]
        if check is not None:
            checks.append(check)
        if self._cap is not None:
            checks.append(Capped(self._cap))
        return self.send(Request("infer", self.model, inputs, asked), AllOf(tuple(checks)))

    def _tiles(
        self, inputs: dict[str, np.ndarray], mode: str | None, bulk_rna: np.ndarray | None
    ) -> dict[str, np.ndarray]:
        if bulk_rna is not None:
            inputs["bulk_rna"] = np.asarray(bulk_rna, dtype=np.float32)
        return self.infer(inputs, mode=mode)

    def stats(self) -> dict[str, dict[str, int]]:
        """Per URL: requests sent, failed attempts, now in flight."""
        return self._dispatcher.stats()

    @property
    def package_sha256(self) -> str:
        """The run's package: the digest the servers reported, else the first answer's ("")."""
        return self._pin.digest

    # -- what the server says ------------------------------------------------------------
    @property
    def info(self) -> ServerInfo:
        """The model as its servers describe it (asked once, on first use).

        Every URL is asked and must serve the same package
        (:func:`~histoserve.remote.served_model.describe`).
        """
        with self._info_lock:
            if self._info is None:
                urls = self._dispatcher.urls
                self._info, self._config = describe(urls, self._model, self.send_to, self._besides)
                self._model = self._info.model
                self._pin = PackagePin(self._info.reported_sha256)
            return self._info

    def send_to(self, url: str, request: Request) -> Any:
        """``request`` to ``url`` only (describing each server), through the one send."""
        return self.send(request, url=url)

    def config(self) -> dict[str, Any]:
        """The full config (spec, provenance, batching) as the first server reports it.

        Described with :attr:`info` (over HTTP or gRPC); asked again when the
        client was given its ``info`` (``embed`` passes it on).
        """
        if not self._config:
            url = self._dispatcher.urls[0]
            self._config = self.send(
                Request("config", self.model, max_answer_bytes=MAX_CONFIG_BYTES), url=url
            )
        return self._config

    def metadata(self) -> dict[str, Any]:
        """The model's V2 metadata (``GET /v2/models/{name}``; gRPC ``ModelMetadata``)."""
        return self.send(Request("metadata", self.model, max_answer_bytes=MAX_CONFIG_BYTES))

    def ready(self) -> bool:
        """Whether a server is ready (``/v2/health/ready``; gRPC ``ServerReady``)."""
        return bool(self.send(Request("ready")))
