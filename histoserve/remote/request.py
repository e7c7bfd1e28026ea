"""What the client sends: one :class:`Request` per call, and the one :class:`Transport` that takes it.

Every call of the client (describing a model, listing models, health,
inference of tiles, tissue masks and slide heads) is a :class:`Request`, and
every request goes through :meth:`Transport.send`: the shape of httpx's
``Client.send`` over ``transport.handle_request``. So a transport given to
:class:`~histoserve.HistoserveClient` (``transports=``: a test's fake, a
custom network) sees every request the client makes, describe included.

Kinds and what ``send`` returns:

- ``infer``: an :class:`~histoserve.remote.transport.Answer`
  (``POST /v2/models/{m}/infer``; gRPC ``ModelInfer``);
- ``config``: the model's description, a JSON object
  (``GET /v2/models/{m}/config``; gRPC ``ModelConfig``, its parameters the same
  keys, each a JSON text);
- ``metadata``: the model's V2 metadata (``GET /v2/models/{m}``; gRPC ``ModelMetadata``);
- ``models``: the names of the served models (``GET /v1/models``; gRPC ``RepositoryIndex``);
- ``ready``: whether the server is ready (``GET /v2/health/ready``; gRPC ``ServerReady``).

Errors are the tree's: :class:`~histoserve.errors.RetryableError` (tried
again), :class:`~histoserve.errors.ServerRefused` (a 4xx or its gRPC code:
never retried).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

Kind = Literal["infer", "config", "metadata", "models", "ready"]
KINDS: tuple[Kind, ...] = ("infer", "config", "metadata", "models", "ready")

MAX_CONFIG_BYTES = 16 << 20
"""Largest description read: a multimodal config lists its genes (60,000 names ~ 1 MB)."""
DEFAULT_MAX_ANSWER_BYTES = 64 << 20
"""An answer's bound when no check sizes it (an output of unknown shape)."""


@dataclass(frozen=True)
class Request:
    """One call to one server.

    Attributes:
        kind: What is asked (see the module docstring).
        model: The model it is about ("" for ``models`` and ``ready``).
        inputs: Input tensors, the batch axis first (``infer`` only).
        parameters: Request parameters (``mode``; ``infer`` only).
        max_answer_bytes: The largest answer read; a larger one is refused unread.
    """

    kind: Kind
    model: str = ""
    inputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    parameters: Mapping[str, Any] = field(default_factory=dict)
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def rows(self) -> int:
        """Rows of the request's first input (0 for a request without inputs)."""
        return len(next(iter(self.inputs.values()))) if self.inputs else 0

    def describe(self) -> str:
        """For messages: ``infer 'h0-mini'``, ``config 'h0-mini'``, ``models``."""
        return f"{self.kind} {self.model!r}" if self.model else self.kind


class Transport(Protocol):
    """One server URL (V2 REST, V2 gRPC, a test's fake)."""

    url: str

    def send(self, request: Request) -> Any:
        """The answer to ``request`` (see the module docstring for each kind)."""
        ...

    def close(self) -> None: ...
