"""An in-memory transport for the dispatcher: the client's retry and check logic without sockets.

:class:`~histoserve.remote.dispatch.Dispatcher` talks to each URL through the
small ``Transport`` interface (``url``, ``send``, ``close``,
:mod:`histoserve.remote.request`) that the REST and gRPC transports implement.
:class:`MemoryTransport` implements it with functions: an inference request
gets ``answer(model, inputs, parameters)`` and returns the answer's outputs,
or raises the error an attempt would (a ``RetryableError`` for a 503 or a
reset, ``ServerRefused`` for a 4xx); any other request gets ``describe(request)``
(the model's config, its models, ...). Every request is recorded
(``requests``), and every inference call with the answer bound the
dispatcher gave it (``calls``). For the client's own rules only; the wire is
tested against real servers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from histoserve.remote.request import Request
from histoserve.remote.transport import Answer

Answerer = Callable[[str, Mapping[str, np.ndarray], Mapping[str, Any]], Mapping[str, np.ndarray]]
Describer = Callable[[Request], Any]


@dataclass
class MemoryTransport:
    """``url``'s answers come from ``answer(model, inputs, parameters)``.

    Attributes:
        calls: ``(model, n_rows, parameters, max_answer_bytes)`` per inference call.
        identity: What every answer says about who answered (``model_name``, ``parameters``).
        describe: Answers every other request (None: none expected, a ``LookupError``).
        requests: Every request sent here, in order, of every kind.
    """

    url: str
    answer: Answerer
    identity: Mapping[str, Any] = field(default_factory=dict)
    describe: Describer | None = None
    calls: list[tuple[str, int, dict[str, Any], int]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    closed: bool = False

    def send(self, request: Request) -> Any:
        self.requests.append(request)
        if request.kind != "infer":
            if self.describe is None:
                raise LookupError(f"{self.url}: no answer for {request.describe()}")
            return self.describe(request)
        model, inputs, parameters = request.model, request.inputs, request.parameters
        self.calls.append((model, request.rows, dict(parameters), request.max_answer_bytes))
        return Answer(self.answer(model, inputs, parameters), self.identity)

    def close(self) -> None:
        self.closed = True
