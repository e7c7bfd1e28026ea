"""V2 answers: per-tile results to one ``InferResponse``, serialised without Python loops.

:func:`select_outputs` and :func:`encode_v2` build the response;
:class:`V2Response` serialises it.

Stock ``InferResponse.to_rest`` turns every JSON output into a list with one
``.item()`` call per element (seconds for a batch of 512x512 masks) and, once
outputs are named in the request, ignores ``binary_data_output``. This
subclass keeps each output's data as a numpy array and:

* REST binary: appends the array's own buffer after the JSON header (no
  ``tolist``, no per-element work) with ``binary_data_size`` set;
* REST JSON: one ``reshape(-1).tolist()`` per output (C speed);
* gRPC: raw ``raw_output_contents`` always, as tritonclient expects for raw
  requests and handles for every request.

Every answer carries the answer parameters the model hands over (REST
``parameters``, gRPC ``parameters``): ``package_sha256``, the served
package's digest, so a client notices a package swapped behind its URL.

KServe's ``DataPlane.encode`` and gRPC servicer call ``to_rest`` / ``to_grpc``,
so nothing else needs to change.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from predictor.codecs.samples import DecodedRequest, ModelResponse
from predictor.codecs.tensors import NUMERIC_DTYPES
from predictor.errors import InvalidInput
from predictor.kserve.compat import (
    InferOutput,
    InferResponse,
    ModelInferResponse,
    to_grpc_parameters,
)


@dataclass
class V2DecodedRequest(DecodedRequest):
    """A :class:`DecodedRequest` plus what the V2 answer needs.

    Attributes:
        binary_output: Return outputs in the binary extension (``binary_data_output``).
        request_id: Echoed in the response.
        output_binary: Requested output name to its ``binary_data`` parameter,
            for the outputs where the client set one.
    """

    binary_output: bool = False
    request_id: str | None = None
    output_binary: dict[str, bool] = field(default_factory=dict)


class V2Response(InferResponse):
    """An ``InferResponse`` whose outputs hold numpy arrays and a binary choice each.

    Args:
        response_id: Echoed request id (a fresh UUID when None or empty).
        model_name: The model's name in URLs.
        infer_outputs: Outputs whose ``data`` is a numpy array of their datatype.
        binary: Output name to whether REST sends it in the binary extension.
        model_version: Optional model version.
        parameters: The answer's parameters (``package_sha256``), string values.
    """

    def __init__(
        self,
        response_id: str | None,
        model_name: str,
        infer_outputs: list[InferOutput],
        binary: Mapping[str, bool],
        model_version: str | None = None,
        parameters: Mapping[str, str] | None = None,
    ):
        super().__init__(
            response_id=response_id or str(uuid.uuid4()),
            model_name=model_name,
            infer_outputs=infer_outputs,
            model_version=model_version,
            parameters=dict(parameters) if parameters else None,
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
            parameters=to_grpc_parameters(dict(self.parameters or {})),
            outputs=tensors,
            raw_output_contents=raw,
        )


def _array(output: InferOutput) -> np.ndarray:
    data = output.data
    if isinstance(data, np.ndarray):
        return data
    return output.as_numpy()


def select_outputs(decoded: V2DecodedRequest, output_names: Sequence[str]) -> list[str]:
    """The outputs to return: the requested ones, in request order, else all.

    The model should call this as soon as it knows the mode's outputs, so an
    unknown requested output fails before any compute.

    Raises:
        InvalidInput: A requested output is not among ``output_names``.
    """
    if decoded.requested_outputs is None:
        return list(output_names)
    for name in decoded.requested_outputs:
        if name not in output_names:
            raise InvalidInput(
                f"requested output '{name}' is not produced here; outputs are {list(output_names)}"
            )
    return list(decoded.requested_outputs)


def encode_v2(
    responses: list[ModelResponse],
    *,
    model_name: str,
    output_names: Sequence[str],
    decoded: V2DecodedRequest,
    datatypes: Mapping[str, str],
    parameters: Mapping[str, str] | None = None,
) -> InferResponse:
    """Stacks per-tile results into one V2 response tensor per output.

    Each output becomes ``[N, ...]`` (``np.stack`` of the tiles' arrays, cast to
    its datatype). The returned :class:`V2Response` keeps the arrays as numpy:
    in REST it writes binary outputs straight from the array buffers and JSON
    outputs with one ``tolist``; in gRPC it always sends raw output contents.

    Args:
        responses: One result per tile, in request order.
        model_name: Name echoed in the response.
        output_names: The outputs this request's mode produces, in order.
        decoded: The request (id, requested outputs, binary choices).
        datatypes: Output name to V2 datatype (``FP32``, ``UINT8``).
        parameters: The answer's parameters (``package_sha256``).

    Raises:
        InvalidInput: A requested output is not produced in this mode.
        RuntimeError: The model's results disagree with ``output_names``
            (a server bug, not the client's).
    """
    names = select_outputs(decoded, output_names)
    if not responses or (decoded.items and len(responses) != len(decoded.items)):
        raise RuntimeError(f"encode_v2 got {len(responses)} results for {len(decoded.items)} tiles")
    outputs = [_stack_output(name, responses, datatypes) for name in names]
    binary = {name: decoded.output_binary.get(name, decoded.binary_output) for name in names}
    return V2Response(
        response_id=decoded.request_id or str(uuid.uuid4()),
        model_name=model_name,
        infer_outputs=outputs,
        binary=binary,
        parameters=parameters,
    )


def _stack_output(
    name: str, responses: list[ModelResponse], datatypes: Mapping[str, str]
) -> InferOutput:
    datatype = datatypes.get(name)
    if datatype not in NUMERIC_DTYPES:
        raise RuntimeError(f"output '{name}' has no numeric V2 datatype (got {datatype!r})")
    try:
        arrays = [r.outputs[name] for r in responses]
        stacked = np.stack(arrays).astype(NUMERIC_DTYPES[datatype], copy=False)
    except (KeyError, ValueError) as exc:
        raise RuntimeError(f"cannot stack output '{name}' across tiles: {exc!r}") from exc
    return InferOutput(name=name, shape=list(stacked.shape), datatype=datatype, data=stacked)
