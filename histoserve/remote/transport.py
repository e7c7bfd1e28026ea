"""One server URL, spoken to over V2 REST with binary tensors (``httpx``).

A transport sends one inference request and either returns the outputs or
raises one of two errors the dispatcher acts on:

- :class:`RetryableError`: 503, 429, other 5xx and 408, connection refused or
  reset, timeouts: the request may succeed elsewhere or later (a replica
  draining, a full queue, a replica gone). Carries the server's
  ``Retry-After`` when it sent one.
- :class:`ServerRefused`: any other 4xx. The request itself is wrong (a bad
  tile, a wrong gene count) or cannot be answered (422: the model overflowed
  to NaN or infinity on it, the same on every replica); retrying cannot
  help, and the slide fails with the server's message.

Every request goes through :func:`~histoserve.remote.http.send`: bounded in
time (``timeout_s`` is the whole request) and in size (what the request can
expect, :func:`answer_bound`).

An answer is an :class:`Answer`: the outputs, plus what the answer says about
who answered (``model_name``, ``model_version``, ``parameters``), checked by
:class:`~histoserve.remote.answers.AnswerCheck`. An answer that cannot
be decoded at all is a :class:`RetryableError` too (another URL may answer
right). Server messages quoted in errors are scrubbed of credentials, whole,
then cut to :data:`~histoserve.remote.auth.MESSAGE_MAX_CHARS`.

Keep-alive connections are recycled every ``recycle_requests`` requests or
``recycle_s`` seconds: a new connection pool is opened for new requests and
the old one is closed once its last request is answered. A Kubernetes Service
balances connections, not requests, so without recycling a long run would
stay pinned to the replicas that existed when it started.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from histoserve import wire
from histoserve.errors import BadAnswer, RemoteError, RetryableError, ServerRefused
from histoserve.remote.auth import MESSAGE_MAX_CHARS, Credentials
from histoserve.remote.http import HEADER_HEADROOM_BYTES, Reply, new_client, parse_retry_after, send
from histoserve.remote.request import DEFAULT_MAX_ANSWER_BYTES, Request
from histoserve.tracecontext import trace_headers

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
DECODE_ERRORS = (ValueError, TypeError, ArithmeticError, LookupError, AttributeError)
"""What decoding a hostile answer can raise (bad JSON, ragged data, 300 as UINT8, ...)."""
_IDENTITY_KEYS = ("model_name", "model_version", "parameters")


class Answer(dict):
    """``{output: array}`` as answered, plus the answer's ``identity``.

    Attributes:
        identity: What the answer says about who answered: ``model_name``,
            ``model_version`` and ``parameters``, those it carries.
    """

    def __init__(self, outputs: Mapping[str, np.ndarray], identity: Mapping[str, Any] = ()):
        super().__init__(outputs)
        self.identity = dict(identity)


@dataclass(frozen=True)
class RecyclePolicy:
    """When a transport opens fresh connections.

    Attributes:
        max_requests: Requests sent over one pool before a new one is opened.
        max_age_s: Seconds one pool lives before a new one is opened.
    """

    max_requests: int = 1000
    max_age_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")
        if not self.max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0, got {self.max_age_s}")


class _Pool:
    """A connection pool (or channel) with the requests currently using it."""

    def __init__(self, client: Any, now_s: float):
        self.client, self.born_s = client, now_s
        self.requests = self.users = 0
        self.retired = False


class Recycler:
    """Hands out the current pool; replaces it per policy; closes old ones when idle.

    Args:
        factory: Makes a new client (``httpx.Client`` or a gRPC client).
        close: Closes a client.
        policy: When to replace the current pool.
    """

    def __init__(self, factory: Any, close: Any, policy: RecyclePolicy):
        self._factory, self._close, self._policy = factory, close, policy
        self._lock = threading.Lock()
        self._current: _Pool | None = None
        self.pools_opened = 0

    def acquire(self) -> _Pool:
        """The pool to send one request over (call :meth:`release` after)."""
        now = time.monotonic()
        with self._lock:
            pool = self._current
            if pool is None or self._expired(pool, now):
                if pool is not None:
                    self._retire(pool)
                pool = self._current = _Pool(self._factory(), now)
                self.pools_opened += 1
            pool.users += 1
            pool.requests += 1
            return pool

    def release(self, pool: _Pool) -> None:
        """One request over ``pool`` is done; closes it when retired and idle."""
        with self._lock:
            pool.users -= 1
            close = pool.retired and pool.users == 0
        if close:
            self._close(pool.client)

    def discard(self, pool: _Pool) -> None:
        """Stops handing out ``pool`` (its connection broke); closed when idle."""
        with self._lock:
            if self._current is pool:
                self._current = None
                self._retire(pool)

    def retire_current(self) -> None:
        """Stops handing out the current pool (new settings); closed when idle."""
        with self._lock:
            pool, self._current = self._current, None
            if pool is not None:
                self._retire(pool)

    def close(self) -> None:
        """Closes the current pool (and any idle retired one)."""
        with self._lock:
            pool, self._current = self._current, None
        if pool is not None:
            self._close(pool.client)

    def _expired(self, pool: _Pool, now: float) -> bool:
        policy = self._policy
        return pool.requests >= policy.max_requests or now - pool.born_s >= policy.max_age_s

    def _retire(self, pool: _Pool) -> None:
        pool.retired = True
        if pool.users == 0:
            self._close(pool.client)


class HttpTransport:
    """V2 REST with the binary tensor extension to one base URL.

    Args:
        url: ``http(s)://host:port``.
        timeout_s: Whole-request deadline (connect to last byte).
        policy: Keep-alive recycling.
        credentials: CA bundle, headers (token) and proxy use for every request.
    """

    def __init__(
        self,
        url: str,
        timeout_s: float,
        policy: RecyclePolicy,
        credentials: Credentials | None = None,
    ):
        self.url = url.rstrip("/")
        self._timeout_s = timeout_s
        self._credentials = credentials or Credentials()
        self._recycler = Recycler(self._new_client, lambda c: c.close(), policy)

    def _new_client(self) -> httpx.Client:
        return new_client(self.url, self._timeout_s, self._credentials)

    @property
    def pools_opened(self) -> int:
        """Connection pools opened so far (1 + recycles + reconnects)."""
        return self._recycler.pools_opened

    def send(self, request: Request) -> Any:
        """The answer to ``request`` (:mod:`~histoserve.remote.request`: an :class:`Answer`
        for ``infer``, a JSON object for ``config`` and ``metadata``, names for
        ``models``, a bool for ``ready``).

        Raises:
            RetryableError: 5xx/429/408, connection errors, the deadline, an
                answer that cannot be decoded or is larger than ``max_answer_bytes``.
            ServerRefused: Any other 4xx, with the server's message.
        """
        if request.kind == "infer":
            return self._infer(request)
        if request.kind == "ready":
            return self._get("/v2/health/ready", request.max_answer_bytes).status == 200
        if request.kind == "models":
            reply = self._get("/v1/models", request.max_answer_bytes)
            answer = self._json(reply)
            listed = answer.get("models") if isinstance(answer, dict) else None
            if not isinstance(listed, list):
                raise BadAnswer(f"{reply.url}: not a model list")
            return [str(m) for m in listed]
        suffix = "/config" if request.kind == "config" else ""
        reply = self._get(f"/v2/models/{request.model}{suffix}", request.max_answer_bytes)
        described = self._json(reply)
        if not isinstance(described, dict):
            raise BadAnswer(
                f"{reply.url}: the {request.kind} of {request.model!r} is not a JSON object"
            )
        return described

    def _get(self, path: str, max_bytes: int) -> Reply:
        """``GET path``: its reply when 2xx (``ready``: any status); else the status's error."""
        pool = self._recycler.acquire()
        try:
            reply = send(
                pool.client,
                self._credentials,
                "GET",
                path,
                timeout_s=self._timeout_s,
                max_bytes=max_bytes,
            )
        except RetryableError:
            self._recycler.discard(pool)
            raise
        finally:
            self._recycler.release(pool)
        if reply.status >= 400 and path != "/v2/health/ready":
            raise status_error(self.url, reply, self._credentials)
        return reply

    @staticmethod
    def _json(reply: Reply) -> Any:
        try:
            return reply.json()
        except ValueError as exc:
            raise BadAnswer(f"{reply.url}: not JSON") from exc

    def _infer(self, request: Request) -> Answer:
        inputs, parameters, model = request.inputs, request.parameters, request.model
        max_answer_bytes = request.max_answer_bytes
        body, headers = wire.encode_request(inputs, parameters=parameters)
        headers["content-length"] = str(len(body))
        headers.update(trace_headers())  # a traced run's traceparent (histoserve.tracecontext)
        # httpx keeps a request (and so its body) in a reference cycle with its
        # response until the cyclic GC runs: 18 bodies of ~10 MB were seen alive with
        # 4 in flight. An exhausted iterator lets go of the body once it is sent.
        content = iter((body,))
        del body
        pool = self._recycler.acquire()
        try:
            reply = send(
                pool.client,
                self._credentials,
                "POST",
                f"/v2/models/{model}/infer",
                timeout_s=self._timeout_s,
                max_bytes=max_answer_bytes,
                content=content,
                headers=headers,
            )
        except RetryableError:
            self._recycler.discard(pool)
            raise
        finally:
            self._recycler.release(pool)
        if reply.status >= 400:
            raise status_error(self.url, reply, self._credentials)
        return decode_answer(
            self.url, reply.body, reply.headers.get(wire.HEADER), self._credentials
        )

    def close(self) -> None:
        """Closes the connections."""
        self._recycler.close()


def decode_answer(
    url: str, body: bytes, header_length: str | None, credentials: Credentials
) -> Answer:
    """A V2 REST answer's outputs and identity.

    Raises:
        BadAnswer: ``"<url>: malformed answer: ..."`` for anything that does
            not decode (another URL may answer right).
    """
    try:
        outputs, header = wire.decode_response(body, header_length)
    except DECODE_ERRORS as exc:
        message = credentials.scrub(str(exc), MESSAGE_MAX_CHARS)
        raise BadAnswer(f"{url}: malformed answer: {message}") from exc
    return Answer(outputs, {k: header[k] for k in _IDENTITY_KEYS if k in header})


def status_error(url: str, reply: Reply, credentials: Credentials) -> RemoteError:
    """The error a 4xx/5xx answer is: retryable (408, 429, 5xx) or a refusal."""
    message = reply.message(credentials)
    status = f"HTTP {reply.status}"
    if reply.status in RETRY_STATUS:
        retry_after_s = parse_retry_after(reply.headers.get("retry-after"))
        return RetryableError(f"{url}: {status}: {message}", retry_after_s, reply.status)
    return ServerRefused(status, message, reply.status)


def answer_bound(rows: int, elements_per_row: int | None) -> int:
    """Bytes an answer of ``rows`` rows of ``elements_per_row`` values may take.

    24 bytes a value covers any value written as JSON text, so a server that
    answers JSON rather than binary tensors is within it too; None (a shape not
    known): :data:`DEFAULT_MAX_ANSWER_BYTES`.
    """
    if elements_per_row is None:
        return DEFAULT_MAX_ANSWER_BYTES
    return HEADER_HEADROOM_BYTES + 24 * max(rows, 1) * max(elements_per_row, 1)
