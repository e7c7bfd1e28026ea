"""KServe's DataPlane with histoserve's decoding and liveness.

Three overrides: byte bodies of the V2 binary tensor extension are parsed by
our own parser (:func:`predictor.codecs.v2.parse_binary_body`, handed in by
whoever builds the dataplane: this folder sits below the codecs), which also takes plain JSON sent without a content type
(stock KServe decodes ``BYTES`` elements as UTF-8 text, which
breaks raw PNG/JPEG tiles), liveness turns false once a model reports its
device unusable, so Kubernetes restarts the pod, and server readiness turns
false while any model is not healthy (draining, or its device lost).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from predictor.kserve.compat import INFERENCE_CONTENT_LENGTH_HEADER, DataPlane, InferRequest

BinaryParser = Callable[[bytes, Any, str], InferRequest]
"""``(body, inference-header-content-length, model name) -> InferRequest``."""


class HistoDataPlane(DataPlane):
    """DataPlane whose binary decoding keeps bytes and whose liveness sees the device.

    Args:
        model_registry: KServe's model repository (as ``DataPlane``'s).
        parse_body: The V2 body parser (:func:`predictor.codecs.v2.parse_binary_body`).
    """

    def __init__(self, model_registry: Any, parse_body: BinaryParser):
        super().__init__(model_registry=model_registry)
        self._parse_body = parse_body

    def decode_inference_request(self, body: Any, headers: dict, model_name: str) -> InferRequest:
        if not isinstance(body, bytes):
            return super().decode_inference_request(body, headers, model_name)
        # No header: the whole body is JSON (clients such as tritonclient send
        # JSON without a content-type, so FastAPI hands us bytes).
        return self._parse_body(body, headers.get(INFERENCE_CONTENT_LENGTH_HEADER), model_name)

    async def live(self) -> dict[str, str]:  # type: ignore[override]
        for model in self.model_registry.get_models().values():
            if getattr(model, "live", True) is False:
                return {"status": f"device unusable for model {model.name}"}
        return {"status": "alive"}

    async def ready(self) -> bool:
        """Server readiness (``/v2/health/ready``, gRPC ``ServerReady``): every model healthy.

        KServe's own answers true whenever the process is up, so a probe on it
        (the ServingRuntime's) stayed ready through a drain and after the device
        was lost.
        """
        for model in self.model_registry.get_models().values():
            if not await model.healthy():
                return False
        return True
