"""The client's errors, one tree, and what each one means for a caller.

::

    HistoserveError            base of every error the client raises on purpose
    ├── UsageError             what was asked is wrong (an argument, a flag, the manifest, a model
    │                          that cannot answer it): ``histoserve embed`` exits 2, nothing embedded
    ├── EmbedError             a run of ``embed`` or ``aggregate`` failed (:mod:`histoserve.embedding`)
    │   └── SlideError         this slide fails alone (``failed`` in status.csv); the others go on
    └── RemoteError            a server or the network (:mod:`histoserve.remote`)
        ├── RetryableError     this attempt failed; another (elsewhere, later) may not
        │   └── BadAnswer      an answer that does not fit its request: wrong, too large, late
        ├── ServerRefused      the server refused the request (4xx): retrying cannot help
        └── RequestFailed      refused, or every attempt failed: the slide fails with the reason
            └── InferenceError the server's own refusal: ``status`` (HTTP status or gRPC code)

:class:`~histoserve.HistoserveClient` raises :class:`RemoteError` and
:class:`UsageError` only; ``embed`` and ``aggregate`` add :class:`EmbedError`.
Messages say what is wrong *and* how to fix it (which flag or manifest column),
because they end up in ``status.csv`` read by someone who did not write the code.
Third-party errors (OpenSlide, tifffile, h5py) are wrapped with ``raise ... from``.
"""

from __future__ import annotations


class HistoserveError(Exception):
    """Base of every error the client raises on purpose: ``except HistoserveError`` catches them all."""


class UsageError(HistoserveError):
    """Bad usage (``--shard``, no slides, a bad manifest, a model that cannot answer what is
    asked): ``histoserve embed`` stops with exit status 2."""


class EmbedError(HistoserveError):
    """A run of ``embed`` or ``aggregate`` failed, or one of its slides did."""


class SlideError(EmbedError):
    """This slide cannot be embedded; the message says why and how to fix it."""


class RemoteError(HistoserveError):
    """A server or the network failed a request (messages are scrubbed of credentials)."""


class RetryableError(RemoteError):
    """This attempt failed in a way another attempt (elsewhere or later) may not.

    503, 429, other 5xx and 408, connection refused or reset, a passed deadline,
    an answer that does not decode. ``retry_after_s``: the server's ``Retry-After``;
    ``status``: the server's HTTP status (or gRPC code) when it answered one, else None.
    """

    def __init__(
        self, message: str, retry_after_s: float | None = None, status: int | str | None = None
    ):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.status = status


class BadAnswer(RetryableError):
    """An answer that does not fit its request (outputs, rows, size, package) or does
    not decode: a failed attempt, retried elsewhere like a 503, never used."""


class ServerRefused(RemoteError):
    """The server refused the request as invalid (4xx): never retried.

    ``status``: ``"HTTP 400"``, ``"gRPC INVALID_ARGUMENT"``; ``code``: ``400``,
    ``"INVALID_ARGUMENT"``.
    """

    def __init__(self, status: str, message: str, code: int | str | None = None):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.code = code


class RequestFailed(RemoteError):
    """A request the server refused (4xx) or that failed on every attempt."""


class InferenceError(RequestFailed):
    """A request the server itself refused: a 4xx, or an error status on every attempt.

    Attributes:
        status: The HTTP status (``400``, ``503``), or the gRPC status code
            (``"INVALID_ARGUMENT"``) over gRPC.
        retry_after_s: The server's ``Retry-After`` on the last attempt, if any.
    """

    def __init__(self, status: int | str, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s
