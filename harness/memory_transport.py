"""An in-memory transport for the dispatcher: the client's retry and check logic without sockets.

:class:`~histoserve.remote.dispatch.Dispatcher` talks to each URL through the
small ``Transport`` interface (``url``, ``infer``, ``close``) that the REST and
gRPC transports implement. :class:`MemoryTransport` implements it with a
function: each call gets the request and returns the answer's outputs, or
raises the error an attempt would (a ``RetryableError`` for a 503 or a reset,
``ServerRefused`` for a 4xx). Every call is recorded, with the answer bound
the dispatcher gave it. For the dispatcher's own rules only; the wire is
tested against real servers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from histoserve.remote.transport import Answer

Answerer = Callable[[str, Mapping[str, np.ndarray], Mapping[str, Any]], Mapping[str, np.ndarray]]


@dataclass
class MemoryTransport:
    """``url``'s answers come from ``answer(model, inputs, parameters)``.

    Attributes:
        calls: ``(model, n_rows, parameters, max_answer_bytes)`` per call.
        identity: What every answer says about who answered (``model_name``, ``parameters``).
    """

    url: str
    answer: Answerer
    identity: Mapping[str, Any] = field(default_factory=dict)
    calls: list[tuple[str, int, dict[str, Any], int]] = field(default_factory=list)
    closed: bool = False

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        parameters: Mapping[str, Any],
        max_answer_bytes: int,
    ) -> Answer:
        rows = len(next(iter(inputs.values()))) if inputs else 0
        self.calls.append((model, rows, dict(parameters), max_answer_bytes))
        return Answer(self.answer(model, inputs, parameters), self.identity)

    def close(self) -> None:
        self.closed = True
