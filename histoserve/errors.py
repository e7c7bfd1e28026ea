"""Client-side errors of ``histoserve embed``, and what each one means for a run.

::

    EmbedError                 base of every error the client raises on purpose
    ├── UsageError             the command line or manifest is wrong: exit status 2, nothing embedded
    ├── SlideError             this slide fails alone (``failed`` in status.csv); the others go on
    └── RemoteError            a server or the network (:mod:`histoserve.remote`)
        ├── RetryableError     this attempt failed; another (elsewhere, later) may not
        │   └── BadAnswer      an answer that does not fit its request: wrong, too large, late
        ├── ServerRefused      the server refused the request (4xx): retrying cannot help
        ├── InferenceError     :class:`~histoserve.HistoserveClient`: any 4xx/5xx, with its status
        └── RequestFailed      refused, or every attempt failed: the slide fails with the reason

Messages say what is wrong *and* how to fix it (which flag or manifest column),
because they end up in ``status.csv`` read by someone who did not write the code.
Third-party errors (OpenSlide, tifffile, h5py) are wrapped with ``raise ... from``.
"""

from __future__ import annotations


class EmbedError(Exception):
    """Base of client-side embed errors."""


class UsageError(EmbedError):
    """Bad usage (``--shard``, no slides, a bad manifest): the run stops with exit status 2."""


class SlideError(EmbedError):
    """This slide cannot be embedded; the message says why and how to fix it."""


class RemoteError(EmbedError):
    """A server or the network failed a request (messages are scrubbed of credentials)."""


class RetryableError(RemoteError):
    """This attempt failed in a way another attempt (elsewhere or later) may not.

    503, 429, other 5xx and 408, connection refused or reset, a passed deadline,
    an answer that does not decode. ``retry_after_s``: the server's ``Retry-After``.
    """

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BadAnswer(RetryableError):
    """An answer that does not fit its request (outputs, rows, size, package) or does
    not decode: a failed attempt, retried elsewhere like a 503, never used."""


class ServerRefused(RemoteError):
    """The server refused the request as invalid (4xx): never retried."""

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class InferenceError(RemoteError):
    """:class:`~histoserve.HistoserveClient`'s refused request; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str, retry_after_s: float | None = None):
        self.status = status
        self.retry_after_s = retry_after_s
        super().__init__(f"HTTP {status}: {message}")


class RequestFailed(RemoteError):
    """A request the server refused (4xx) or that failed on every attempt."""
