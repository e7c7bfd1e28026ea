"""Requests spread over several servers: fewest in flight first, retried elsewhere.

:class:`Dispatcher` is called from many threads at once (``--concurrency``).
Each request goes to the URL with the fewest requests in flight (ties: the one
used longest ago; a URL that just failed is passed over for a moment), so a
slow or busy replica gets less work and a fast one more, without any
configuration. A retryable failure (503 while draining, a
full queue's 503/429, a reset connection, gRPC ``UNAVAILABLE``) is retried up
to ``max_attempts`` times in all, preferably on ANOTHER URL: a replica going
away mid-request costs one retry, nothing is lost. The wait before a retry is
the server's ``Retry-After`` when it sent one, else exponential backoff with
full jitter (``uniform(0, min(cap, base * 2**attempt))``), so many clients
hitting one overloaded server do not retry in lockstep. A 4xx is never
retried: it raises :class:`RequestFailed` with the server's message.

An answer is returned only once it passed the request's
:class:`~histoserve.remote.answers.AnswerCheck` (rows, outputs, dtype,
shape, finite values): a wrong answer is a failed attempt like a 503, retried
here, preferably elsewhere, so that another URL answers it.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from histoserve.errors import InferenceError, RequestFailed, RetryableError, ServerRefused
from histoserve.remote.answers import Check
from histoserve.remote.auth import Credentials
from histoserve.remote.request import Request, Transport
from histoserve.remote.transport import Answer, HttpTransport, RecyclePolicy

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How failed attempts are retried.

    Attributes:
        max_attempts: Attempts per request in all (first try included).
        backoff_base_s: First backoff ceiling; doubles per attempt.
        backoff_max_s: Largest backoff ceiling.
        retry_after_max_s: Longest ``Retry-After`` honoured (a misconfigured
            server cannot park the client for an hour).
        cool_down_s: After a failed attempt, new requests prefer the other URLs
            for this long (or the server's ``Retry-After`` when shorter): a replica
            that went away does not keep attracting first attempts because its
            failures leave it with the fewest in flight.
    """

    max_attempts: int = 8
    backoff_base_s: float = 0.1
    backoff_max_s: float = 10.0
    retry_after_max_s: float = 60.0
    cool_down_s: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.backoff_base_s < 0 or self.backoff_max_s < self.backoff_base_s:
            raise ValueError(
                f"need 0 <= backoff_base_s <= backoff_max_s, got "
                f"{self.backoff_base_s}, {self.backoff_max_s}"
            )

    def run(
        self,
        attempt: Callable[[int], T],
        sleep: Callable[[float], Any],
        rng: random.Random,
        what: str = "request",
    ) -> T:
        """``attempt(n)`` (``n`` from 1) until it returns; the one retry loop of the client.

        A :class:`RetryableError` is waited out (:meth:`delay_s`) and tried
        again, up to ``max_attempts`` in all; anything else propagates at once.

        Raises:
            RequestFailed: Every attempt failed (the last error is its cause): an
                :class:`InferenceError` with the server's status when the last
                attempt got an error status, with its ``Retry-After``.
        """
        last: RetryableError | None = None
        for n in range(1, self.max_attempts + 1):
            try:
                return attempt(n)
            except RetryableError as exc:
                last = exc
            if n < self.max_attempts:
                sleep(self.delay_s(n, last.retry_after_s, rng))
        message = f"{what} failed {self.max_attempts} times; last error: {last}"
        if last is not None and last.status is not None:
            raise InferenceError(last.status, message, last.retry_after_s) from last
        raise RequestFailed(message) from last

    def delay_s(self, attempt: int, retry_after_s: float | None, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        if retry_after_s is not None:
            # A little jitter on top, so clients told the same Retry-After spread out.
            return min(retry_after_s, self.retry_after_max_s) + rng.uniform(0, 0.1)
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
        return rng.uniform(0, ceiling)


class _Slot:
    """A transport with its load and counters (guarded by the dispatcher's lock)."""

    def __init__(self, transport: Transport, order: int):
        self.transport, self.order = transport, order
        self.in_flight = 0
        self.last_used = 0
        self.sent = self.failed = 0
        self.cool_until = 0.0  # monotonic: after a failure, others are preferred until then


def make_transport(
    url: str, timeout_s: float, recycle: RecyclePolicy, credentials: Credentials | None = None
) -> Transport:
    """An HTTP(S) or gRPC(S) transport by URL scheme, sending ``credentials`` on every request."""
    if url.startswith(("grpc://", "grpcs://")):
        from histoserve.remote.grpc_transport import GrpcTransport

        return GrpcTransport(url, timeout_s, recycle, credentials)
    return HttpTransport(url, timeout_s, recycle, credentials)


class Dispatcher:
    """Thread-safe V2 inference over several URLs.

    Args:
        transports: One per URL.
        retry: Retry policy.
        sleep: Waits between attempts (tests pass an event's ``wait``).
        seed: Seeds the jitter.
    """

    def __init__(
        self,
        transports: Sequence[Transport],
        retry: RetryPolicy,
        sleep: Callable[[float], Any] = time.sleep,
        seed: int | None = None,
    ):
        if not transports:
            raise ValueError("a dispatcher needs at least one transport")
        self._slots = [_Slot(t, i) for i, t in enumerate(transports)]
        self._retry, self._sleep = retry, sleep
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._clock = 0
        self.failed_attempts = 0

    @classmethod
    def from_urls(
        cls,
        urls: Sequence[str],
        timeout_s: float,
        retry: RetryPolicy,
        recycle: RecyclePolicy,
        credentials: Credentials | None = None,
    ) -> Dispatcher:
        """A dispatcher over ``urls`` (``http(s)://`` or ``grpc(s)://``)."""
        return cls([make_transport(u, timeout_s, recycle, credentials) for u in urls], retry)

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        parameters: Mapping[str, Any] | None = None,
        check: Check | None = None,
    ) -> Answer:
        """Runs one inference request somewhere; returns its checked outputs (:meth:`send`)."""
        request = Request("infer", model, inputs, parameters or {})
        return self.send(request, check)

    def send(self, request: Request, check: Check | None = None, url: str | None = None) -> Any:
        """``request``'s answer, retried by the one loop (:meth:`RetryPolicy.run`).

        Args:
            request: What to send (:class:`~histoserve.remote.request.Request`).
            check: What an ``infer`` answer must be (rows = ``N``, outputs,
                dtypes, shapes, identity); an answer that fails it is a failed
                attempt, retried like a 503. Its answer bound is the request's.
            url: Send to this URL only (describing each server); None: the
                URL with the fewest in flight, retried preferably elsewhere.

        Raises:
            InferenceError: A 4xx (the server's status and message), or an error
                status on every attempt (a :class:`RequestFailed`).
            RequestFailed: Every attempt failed otherwise (last error).
        """
        if check is not None:
            request = dataclasses.replace(
                request, max_answer_bytes=check.max_answer_bytes(request.rows)
            )
        only = self._slot_of(url) if url is not None else None
        tried: list[_Slot] = []

        def attempt(_: int) -> Any:
            slot = self._pick(tried[-1] if tried else None, only)
            tried.append(slot)
            try:
                return self._attempt(slot, request, check)
            except RetryableError as exc:
                self._count_failure(slot, exc.retry_after_s)
                raise

        what = "request" if request.kind == "infer" else f"asking {url} for {request.describe()}"
        return self._retry.run(attempt, self._sleep, self._rng, what=what)

    def _slot_of(self, url: str) -> _Slot:
        for slot in self._slots:
            if slot.transport.url.rstrip("/") == url.rstrip("/"):
                return slot
        raise ValueError(f"no transport for {url}")

    def _attempt(self, slot: _Slot, request: Request, check: Check | None) -> Any:
        """One attempt on ``slot``: its checked answer, or a RetryableError (4xx: RequestFailed)."""
        url = slot.transport.url
        try:
            answer = slot.transport.send(request)
            if request.kind == "infer" and not isinstance(answer, Answer):
                answer = Answer(answer)  # a fake's plain mapping: no identity
            if check is not None:
                check.verify(answer, request.rows, url)
            return answer
        except ServerRefused as exc:
            message = f"{url} refused the request: {exc}"
            if exc.code is None:
                raise RequestFailed(message) from exc
            raise InferenceError(exc.code, message) from exc
        finally:
            self._done(slot)

    def _pick(self, avoid: _Slot | None, only: _Slot | None = None) -> _Slot:
        with self._lock:
            now = time.monotonic()
            candidates = [s for s in self._slots if s is not avoid] or self._slots
            candidates = [only] if only is not None else candidates
            slot = min(
                candidates,
                key=lambda s: (s.cool_until > now, s.in_flight, s.last_used, s.order),
            )
            self._clock += 1
            slot.in_flight += 1
            slot.last_used = self._clock
            slot.sent += 1
            return slot

    def _done(self, slot: _Slot) -> None:
        with self._lock:
            slot.in_flight -= 1

    def _count_failure(self, slot: _Slot, retry_after_s: float | None) -> None:
        with self._lock:
            slot.failed += 1
            self.failed_attempts += 1
            cool_s = min(self._retry.cool_down_s, retry_after_s or self._retry.cool_down_s)
            slot.cool_until = time.monotonic() + cool_s

    @property
    def urls(self) -> list[str]:
        """Each transport's URL, in order."""
        return [slot.transport.url for slot in self._slots]

    def stats(self) -> dict[str, dict[str, int]]:
        """Per URL: requests sent, failed attempts, now in flight."""
        with self._lock:
            return {
                s.transport.url: {"sent": s.sent, "failed": s.failed, "in_flight": s.in_flight}
                for s in self._slots
            }

    def close(self) -> None:
        """Closes every transport."""
        for slot in self._slots:
            slot.transport.close()

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
