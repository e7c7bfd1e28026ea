"""KServe's DataPlane with histoserve's decoding and liveness.

Two overrides: byte bodies of the V2 binary tensor extension are parsed by
our own parser (stock KServe decodes ``BYTES`` elements as UTF-8 text, which
breaks raw PNG/JPEG tiles), and liveness turns false once a model reports its
device unusable, so Kubernetes restarts the pod.
"""

from __future__ import annotations

from typing import Any

from kserve import InferRequest
from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER
from kserve.protocol.dataplane import DataPlane

from predictor.codecs.v2 import parse_binary_body
from predictor.errors import InvalidInput


class HistoDataPlane(DataPlane):
    """DataPlane whose binary decoding keeps bytes and whose liveness sees the device."""

    def decode_inference_request(self, body: Any, headers: dict, model_name: str) -> InferRequest:
        if not isinstance(body, bytes):
            return super().decode_inference_request(body, headers, model_name)
        raw_length = headers.get(INFERENCE_CONTENT_LENGTH_HEADER)
        if raw_length is None:
            raise InvalidInput(
                f"binary request body without the '{INFERENCE_CONTENT_LENGTH_HEADER}' header "
                "(or a JSON body sent without content-type application/json)"
            )
        try:
            header_length = int(raw_length)
        except ValueError as exc:
            raise InvalidInput(
                f"header '{INFERENCE_CONTENT_LENGTH_HEADER}' is not an integer: {raw_length!r}"
            ) from exc
        return parse_binary_body(body, header_length, model_name)

    async def live(self) -> dict[str, str]:  # type: ignore[override]
        for model in self._model_registry.get_models().values():
            if getattr(model, "live", True) is False:
                return {"status": f"device unusable for model {model.name}"}
        return {"status": "alive"}
