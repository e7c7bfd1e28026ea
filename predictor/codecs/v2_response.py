"""A KServe ``InferResponse`` that serialises numpy outputs without Python loops.

Stock ``InferResponse.to_rest`` turns every JSON output into a list with one
``.item()`` call per element (seconds for a batch of 512x512 masks) and, once
outputs are named in the request, ignores ``binary_data_output``. This
subclass keeps each output's data as a numpy array and:

* REST binary: appends the array's own buffer after the JSON header (no
  ``tolist``, no per-element work) with ``binary_data_size`` set;
* REST JSON: one ``reshape(-1).tolist()`` per output (C speed);
* gRPC: raw ``raw_output_contents`` always, as tritonclient expects for raw
  requests and handles for every request.

KServe's ``DataPlane.encode`` and gRPC servicer call ``to_rest`` / ``to_grpc``,
so nothing else needs to change.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from kserve import InferOutput, InferResponse
from kserve.protocol.grpc.grpc_predict_v2_pb2 import ModelInferResponse


class V2Response(InferResponse):
    """An ``InferResponse`` whose outputs hold numpy arrays and a binary choice each.

    Args:
        response_id: Echoed request id (a fresh UUID when None or empty).
        model_name: The model's name in URLs.
        infer_outputs: Outputs whose ``data`` is a numpy array of their datatype.
        binary: Output name to whether REST sends it in the binary extension.
        model_version: Optional model version.
    """

    def __init__(
        self,
        response_id: str | None,
        model_name: str,
        infer_outputs: list[InferOutput],
        binary: Mapping[str, bool],
        model_version: str | None = None,
    ):
        super().__init__(
            response_id=response_id or str(uuid.uuid4()),
            model_name=model_name,
            infer_outputs=infer_outputs,
            model_version=model_version,
            use_binary_outputs=any(binary.values()),
        )
        self.binary = dict(binary)

    def _header(self, outputs: list[dict[str, Any]]) -> dict[str, Any]:
        header: dict[str, Any] = {
            "id": self.id,
            "model_name": self.model_name,
            "model_version": self.model_version,
            "outputs": outputs,
        }
        if self.parameters:
            header["parameters"] = dict(self.parameters)
        return header

    def to_rest(self) -> tuple[dict[str, Any] | bytes, int | None]:
        """The REST body: a dict (all JSON) or bytes plus the JSON header's length.

        Returns:
            ``(dict, None)`` when no output is binary, else ``(body, json_length)``
            where ``json_length`` goes in ``Inference-Header-Content-Length``.
        """
        entries: list[dict[str, Any]] = []
        buffers: list[memoryview] = []
        for output in self.outputs:
            array = _array(output)
            entry: dict[str, Any] = {
                "name": output.name,
                "shape": list(array.shape),
                "datatype": output.datatype,
            }
            if self.binary.get(output.name, False):
                buffer = memoryview(np.ascontiguousarray(array)).cast("B")
                entry["parameters"] = {"binary_data_size": buffer.nbytes}
                buffers.append(buffer)
            else:
                entry["data"] = array.reshape(-1).tolist()
            entries.append(entry)
        header = self._header(entries)
        if not buffers:
            return header, None
        header_bytes = orjson.dumps(header)
        return b"".join([header_bytes, *buffers]), len(header_bytes)

    def to_grpc(self) -> ModelInferResponse:
        """The gRPC message, every output in ``raw_output_contents``."""
        tensors, raw = [], []
        for output in self.outputs:
            array = np.ascontiguousarray(_array(output))
            tensors.append(
                {"name": output.name, "datatype": output.datatype, "shape": list(array.shape)}
            )
            raw.append(array.tobytes())
        return ModelInferResponse(
            id=self.id,
            model_name=self.model_name,
            model_version=self.model_version or "",
            outputs=tensors,
            raw_output_contents=raw,
        )


def _array(output: InferOutput) -> np.ndarray:
    data = output.data
    if isinstance(data, np.ndarray):
        return data
    return output.as_numpy()
