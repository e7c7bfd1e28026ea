"""What a protocol codec is: the one interface the model talks to.

The model picks a codec once per request (by the payload KServe hands it)
and from then on only calls these three methods, so it never asks which
protocol it is serving. A new protocol is a new class with these methods
(see ``docs/architecture.md``, "Adding a protocol").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from predictor.codecs.samples import DecodedRequest, ModelResponse


class Codec(Protocol):
    """Decodes one protocol's requests into tiles and encodes results back."""

    def decode(self, payload: Any) -> DecodedRequest:
        """The request's tiles, mode and what the answer must echo.

        Raises:
            InvalidInput: Naming the input, the tile and the reason.
        """

    def check_outputs(self, decoded: Any, output_names: Sequence[str]) -> None:
        """Refuses, before any compute, outputs the request asks for that the mode lacks."""

    def encode(
        self,
        decoded: Any,
        responses: Sequence[ModelResponse],
        output_names: Sequence[str],
        parameters: Mapping[str, str] | None = None,
    ) -> Any:
        """The protocol's answer: one entry per tile, in request order.

        ``parameters`` is what every answer says about who made it
        (``package_sha256``); a protocol with answer parameters (V2) carries them.
        """
