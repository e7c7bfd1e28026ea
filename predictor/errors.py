"""The one error tree of histoserve, and how a failed forward is classified.

::

    HistoserveError
    ├── InvalidInput (ValueError)        client input is wrong:  400 / INVALID_ARGUMENT
    │   └── PayloadTooLarge               body over the limit:    413 / RESOURCE_EXHAUSTED
    ├── NonFiniteOutput                   NaN or inf out, never retried: 422 / FAILED_PRECONDITION
    ├── Unavailable                       try again later:        503 / UNAVAILABLE
    │   ├── ForwardError (RuntimeError)   the batch's forward failed
    │   │   └── DeviceLost                ...and the device is unusable (liveness fails)
    │   ├── Overloaded                    queue full (carries retry_after_s)
    │   ├── QueueTimeout                  the request's timeout passed while queued
    │   └── ModelNotReady                 not loaded, unhealthy or draining
    ├── LoadRefused                       a repository load/unload the server's state forbids:
    │                                     409 / FAILED_PRECONDITION (mode, budget, failed load)
    └── StartupError                      fail-fast at start-up: exit 2, one line (503 if served)
        ├── ConfigError (ValueError)      a flag or config value is out of range (usage)
        ├── SpecError                     a spec is malformed or unknown
        ├── CheckpointError               missing, ambiguous, corrupt or tampered package
        ├── IncompatiblePackage           built for another device, ISA or GPU
        └── SpecMismatch                  spec and package disagree (dims, inputs)

Only a :class:`StartupError` is "cannot start" (exit 2): any other exception
during start-up is a bug and surfaces as a traceback (exit 1).

Errors carry no HTTP status: :mod:`predictor.http.edge` maps them to HTTP
and gRPC in one table matched by type (the most specific class of an error's
MRO wins, so row order does not matter). Third-party errors are wrapped with
``raise ... from``.

A failed forward is wrapped once, by :func:`forward_failure` (called by the
batcher): the device layer only *classifies* an exception
(:class:`ErrorKind`), it never wraps it.
"""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    """How a failure of a batch's forward is handled.

    Attributes:
        BATCH: Fail this batch's items with ``ForwardError``; keep serving.
        OOM: Split the batch in halves and retry each before failing.
        FATAL: Fail with ``DeviceLost`` and mark the device unusable.
    """

    BATCH = "batch"
    OOM = "oom"
    FATAL = "fatal"


class HistoserveError(Exception):
    """Root of every error histoserve raises on purpose."""


class InvalidInput(HistoserveError, ValueError):
    """Client input that cannot be served; affects only its own request.

    The message names the input, the tile index (when there is one) and the
    reason, e.g. ``input 'tiles' tile 3: not a decodable image``.
    """

    def __init__(self, reason: str, *, input_name: str | None = None, tile: int | None = None):
        self.reason = reason
        self.input_name = input_name
        self.tile = tile
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.input_name is not None:
            where.append(f"input '{self.input_name}'")
        if self.tile is not None:
            where.append(f"tile {self.tile}")
        return f"{' '.join(where)}: {self.reason}" if where else self.reason

    def at(self, *, input_name: str | None = None, tile: int | None = None) -> InvalidInput:
        """A copy located at an input/tile, keeping any location already set."""
        return InvalidInput(
            self.reason,
            input_name=self.input_name if self.input_name is not None else input_name,
            tile=self.tile if self.tile is not None else tile,
        )


class PayloadTooLarge(InvalidInput):
    """A request body over ``--max_body_bytes`` (declared or streamed)."""


class NonFiniteOutput(HistoserveError):
    """The model answered this request with NaN or infinity; never a 200.

    Deterministic for the request (the same input gives the same overflow on
    any replica), so its status is one clients do not retry; it affects only
    its own request. The message names the output and, where there is one,
    the tile.
    """


class Unavailable(HistoserveError):
    """The server cannot serve this request now; the client may retry."""


class ForwardError(Unavailable, RuntimeError):
    """The forward pass of the batch this request was in failed."""


class DeviceLost(ForwardError):
    """A sticky device error: the device is unusable until the process restarts."""


class Overloaded(Unavailable):
    """The queue is full; retry after ``retry_after_s`` seconds."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0):
        self.retry_after_s = retry_after_s
        super().__init__(message)


class QueueTimeout(Unavailable):
    """The request's deadline (V2 ``timeout``) passed while its tiles were queued; they never ran.

    Unavailable, as Triton answers a queue timeout (``UNAVAILABLE``, "Request
    timeout expired"): the request was sound, the server too busy in time.
    """


class ModelNotReady(Unavailable):
    """The model is not loaded, unhealthy or draining for shutdown."""


class LoadRefused(HistoserveError):
    """A model repository load or unload the server refuses in its present state.

    ``--model_control none``, a load past ``--memory_budget``, a model being
    loaded or unloaded, a package that failed to load: the message names the
    model and why. Not the caller's input (a bad name is :class:`InvalidInput`),
    and not worth retrying as it is.
    """


class StartupError(HistoserveError):
    """Start-up cannot go on; the CLI prints the message and exits non-zero."""


class ConfigError(StartupError, ValueError):
    """A flag or configuration value the server cannot run with (a usage error)."""


class SpecError(StartupError, ValueError):
    """A spec is malformed, incomplete or unknown."""


class CheckpointError(StartupError):
    """A checkpoint is missing, ambiguous, corrupt or fails its SHA-256 check."""


class IncompatiblePackage(StartupError):
    """A package was built for another device key, CPU ISA or GPU capability."""


class SpecMismatch(StartupError):
    """The spec and the package disagree (output dims, inputs, gene lists)."""


def forward_failure(exc: BaseException, *, name: str, n_items: int, fatal: bool) -> HistoserveError:
    """The error a failed batch's requests get: the one wrap of a failed forward.

    A histoserve error passes through unchanged (a fault hook's ``ForwardError``,
    a family's own check), except that a fatal failure is always a
    :class:`DeviceLost`. Anything else is wrapped, naming the batch size and
    the original error, with the original as ``__cause__``.

    Args:
        exc: What the forward raised.
        name: The model name, for the message.
        n_items: Tiles in the batch.
        fatal: Whether the failure left the device unusable.
    """
    cls = DeviceLost if fatal else ForwardError
    passes = isinstance(exc, DeviceLost) if fatal else isinstance(exc, HistoserveError)
    if passes:
        assert isinstance(exc, HistoserveError)
        return exc
    error = cls(f"{name}: forward of a batch of {n_items} failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
