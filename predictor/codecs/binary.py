"""Strict parser of the V2 binary tensor extension request body.

A binary body is a JSON header of ``Inference-Header-Content-Length`` bytes
followed by the raw data of every input whose parameters carry
``binary_data_size``, in input order. KServe's own parser decodes ``BYTES``
elements as UTF-8 text (raw PNG/JPEG tiles fail) and trusts every size; this
one keeps ``BYTES`` elements as ``bytes``, wraps numeric data without copying,
and refuses every inconsistency with :class:`~predictor.errors.InvalidInput`.
The layout itself (header length, JSON header, sizes, ``BYTES`` prefixes) is
read by :mod:`histoserve.wire`, the same reader the clients use.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from histoserve import wire
from predictor.codecs.tensors import DATATYPES, parse_shape, reading_wire
from predictor.errors import InvalidInput
from predictor.kserve.compat import InferInput, InferRequest, RequestedOutput, set_raw_data


def parse_binary_body(
    body: bytes, header_length: int | str | None, model_name: str = ""
) -> InferRequest:
    """Parses a V2 REST request body, binary extension or plain JSON.

    The result is what :func:`predictor.codecs.v2.decode_v2` reads: numeric
    binary inputs have ``_raw_data`` (a memoryview into ``body``), ``BYTES``
    binary inputs have ``data`` as a list of ``bytes``, JSON inputs keep their
    ``data`` list. A body without binary data may be passed with
    ``header_length`` None (or equal to its length).

    Args:
        body: The whole HTTP request body.
        header_length: The ``Inference-Header-Content-Length`` header (int or
            its text), or None when absent.
        model_name: The model name from the URL.

    Returns:
        A ``kserve.InferRequest`` (``from_grpc`` False).

    Raises:
        InvalidInput: Bad header length, malformed JSON, a missing or bad
            field, ``binary_data_size`` absent where data is absent, sizes not
            summing to the body, or ``BYTES`` length prefixes that overrun.
    """
    try:
        memoryview(body)
    except TypeError as exc:
        raise InvalidInput(f"request body must be bytes, got {type(body).__name__}") from exc
    with reading_wire():
        header, view, start = wire.read_header(body, header_length, orjson.loads)
    offset = start
    inputs = []
    for position, spec in enumerate(_list_field(header, "inputs", required=True)):
        infer_input, offset = _input(spec, position, view, offset)
        inputs.append(infer_input)
    with reading_wire():
        wire.check_consumed(view, offset, start)
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput(f"request 'id' must be a string, got {type(request_id).__name__}")
    return InferRequest(
        model_name=model_name,
        infer_inputs=inputs,
        request_id=request_id,
        parameters=_parameters(header.get("parameters"), "request"),
        request_outputs=_outputs(header) or None,
    )


def _list_field(obj: dict[str, Any], key: str, *, required: bool = False) -> list[dict[str, Any]]:
    value = obj.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InvalidInput(f"'{key}' must be a list of objects, got {value!r:.60}")
    return value


def _parameters(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} 'parameters' must be an object, got {type(value).__name__}")
    return value


def _input(
    spec: dict[str, Any], position: int, view: memoryview, offset: int
) -> tuple[InferInput, int]:
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"inputs[{position}] needs a non-empty string 'name', got {name!r:.40}")
    try:
        infer_input = _tensor_header(name, spec)
        size = _binary_size(infer_input, spec)
        if size is None:
            return infer_input, offset
        with reading_wire():
            data = wire.binary_slice(view, offset, size)
            if infer_input.datatype == "BYTES":
                infer_input.data = wire.split_length_prefixed(data, math.prod(infer_input.shape))
            else:
                set_raw_data(infer_input, data)
        return infer_input, offset + size
    except InvalidInput as exc:
        raise exc.at(input_name=name) from None


def _tensor_header(name: str, spec: dict[str, Any]) -> InferInput:
    datatype = spec.get("datatype")
    if not isinstance(datatype, str) or datatype.upper() not in DATATYPES:
        raise InvalidInput(f"unknown datatype {datatype!r:.40}; V2 datatypes are {list(DATATYPES)}")
    shape = list(parse_shape(spec.get("shape")))
    return InferInput(
        name=name,
        shape=shape,
        datatype=datatype,
        parameters=_parameters(spec.get("parameters"), "input"),
    )


def _binary_size(infer_input: InferInput, spec: dict[str, Any]) -> int | None:
    """The input's binary size, or None when its data is inline JSON."""
    params = infer_input.parameters or {}
    size = params.get("binary_data_size")
    if "data" in spec:
        if size is not None:
            raise InvalidInput("has both 'data' and 'binary_data_size'")
        if not isinstance(spec["data"], list):
            raise InvalidInput(f"'data' must be a list, got {type(spec['data']).__name__}")
        infer_input.data = spec["data"]
        return None
    if size is None:
        raise InvalidInput("has neither 'data' nor a 'binary_data_size' parameter")
    return size


def _outputs(header: dict[str, Any]) -> list[RequestedOutput]:
    outputs = []
    for position, spec in enumerate(_list_field(header, "outputs")):
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(
                f"outputs[{position}] needs a non-empty string 'name', got {name!r:.40}"
            )
        params = _parameters(spec.get("parameters"), f"output '{name}'")
        outputs.append(RequestedOutput(name=name, parameters=params))
    return outputs
