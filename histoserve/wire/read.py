"""The V2 binary reader: the header length, the JSON header, tensor slices, responses.

numpy only (see :mod:`histoserve.wire`). The server's request parser
(:mod:`predictor.codecs.binary`) reads with :func:`read_header`,
:func:`binary_slice` and :func:`check_consumed`; the clients read responses
with :func:`decode_response`. Numeric outputs are ``np.frombuffer`` views of
the body (no copy).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from histoserve.wire.format import (
    DATATYPES,
    HEADER,
    MAX_HEADER_DIGITS,
    WireError,
    split_length_prefixed,
)


def header_length(value: object, total: int) -> int:
    """The JSON header's length, from an ``Inference-Header-Content-Length`` value.

    Args:
        value: The header as it arrived (text, or raw ``bytes`` read as
            latin-1), an ``int``, or None when absent (the whole body is JSON).
        total: The body's length in bytes.

    Returns:
        A length in ``1..total``.

    Raises:
        WireError: An empty body, a value that is not plain ASCII decimal
            digits (``"-5"``, ``"²"``, ``"1³"``, ``""``, ``"1e3"``), not an
            ``int``, or outside ``1..total`` (10,000 digits included: never
            converted). The message names the header.
    """
    if total == 0:
        raise WireError("the body is empty")
    if value is None:
        return total
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("latin-1")
    if isinstance(value, str):
        value = _decimal(value, total)
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"{HEADER} must be an integer, got {value!r:.40}")
    if not 0 < value <= total:
        raise WireError(f"{HEADER} {value} is outside the body of {total} bytes")
    return value


def _decimal(text: str, total: int) -> int:
    digits = text.strip(" \t")
    if not (digits.isascii() and digits.isdigit()):  # isdigit alone takes "²"
        raise WireError(f"{HEADER} is not an integer: {text!r:.40}")
    significant = digits.lstrip("0") or "0"
    if len(significant) > MAX_HEADER_DIGITS:
        raise WireError(
            f"{HEADER} of {len(significant)} digits is outside the body of {total} bytes"
        )
    return int(significant)


def _json_loads(data: memoryview) -> Any:
    return json.loads(bytes(data))


def read_header(
    body: bytes | memoryview,
    header_length_value: object,
    loads: Callable[[memoryview], Any] = _json_loads,
) -> tuple[dict[str, Any], memoryview, int]:
    """The JSON header of a binary body, the body as bytes, and where the tensor data starts.

    Args:
        body: The whole body.
        header_length_value: The ``Inference-Header-Content-Length`` value
            (see :func:`header_length`).
        loads: The JSON parser, given a memoryview of the header (the server
            passes ``orjson.loads``); its ``ValueError`` means bad JSON.

    Raises:
        WireError: See :func:`header_length`; a header that is not valid JSON
            or not a JSON object.
    """
    view = memoryview(body).cast("B")
    length = header_length(header_length_value, view.nbytes)
    try:
        header = loads(view[:length])
    except (ValueError, RecursionError) as exc:
        raise WireError(f"JSON header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise WireError(f"JSON header must be an object, got {type(header).__name__}")
    return header, view, length


def binary_slice(view: memoryview, offset: int, size: object) -> memoryview:
    """The ``size`` bytes of one tensor's data at ``offset`` (a view, no copy).

    Raises:
        WireError: ``size`` is not a non-negative integer, or overruns the body.
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise WireError(f"binary_data_size must be a non-negative integer, got {size!r:.40}")
    if offset + size > view.nbytes:
        raise WireError(
            f"binary_data_size {size} at byte {offset} overruns the body of {view.nbytes} bytes"
        )
    return view[offset : offset + size]


def check_consumed(view: memoryview, offset: int, start: int) -> None:
    """Refuses bytes left after the last tensor (``start``: where the data began).

    Raises:
        WireError: The sizes do not add up to the bytes after the JSON header.
    """
    if offset != view.nbytes:
        raise WireError(
            f"binary_data_size values sum to {offset - start} bytes but "
            f"{view.nbytes - start} follow the JSON header"
        )


def decode_response(
    body: bytes, header_length_value: int | str | None
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The outputs of a V2 REST response, binary or JSON, and its JSON header.

    Args:
        body: The whole response body.
        header_length_value: The ``Inference-Header-Content-Length`` response
            header (int or its text); None when absent (a plain JSON body).

    Returns:
        ``({name: array}, header)``. Numeric binary outputs are read-only views
        of ``body``; ``BYTES`` outputs are object arrays of ``bytes`` (binary)
        or of the JSON values (JSON).

    Raises:
        WireError: A header length outside the body, a header that is not a
            JSON object with an ``outputs`` list, an output named twice, an
            unknown datatype, JSON data that are not numbers of a numeric
            datatype (``"0.51"``, ``true``), sizes that disagree with shapes, a
            body shorter or longer than the sizes.
    """
    header, view, start = read_header(body, header_length_value)
    offset, outputs = start, {}
    for position, spec in enumerate(_outputs_of(header)):
        name, datatype, shape = _output_fields(spec, position)
        if name in outputs:
            raise WireError(f"output {name!r} is answered twice (outputs[{position}])")
        size = (spec.get("parameters") or {}).get("binary_data_size")
        if size is None:
            outputs[name] = _json_output(spec, name, datatype, shape)
            continue
        try:
            data = binary_slice(view, offset, size)
        except WireError as exc:
            raise WireError(f"output {name!r}: {exc}") from exc
        outputs[name] = _binary_output(data, name, datatype, shape)
        offset += size
    check_consumed(view, offset, start)
    return outputs, header


def _outputs_of(header: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    outputs = header.get("outputs")
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise WireError(f"response has no 'outputs' list: {json.dumps(header)[:200]}")
    return outputs


def _output_fields(spec: Mapping[str, Any], position: int) -> tuple[str, str, tuple[int, ...]]:
    name, datatype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
    if not isinstance(name, str):
        raise WireError(f"outputs[{position}] has no string 'name'")
    if datatype != "BYTES" and datatype not in DATATYPES:
        raise WireError(f"output {name!r}: unknown datatype {datatype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise WireError(f"output {name!r}: shape must be a list of sizes, got {shape!r:.60}")
    return name, datatype, tuple(shape)


def _json_output(
    spec: Mapping[str, Any], name: str, datatype: str, shape: tuple[int, ...]
) -> np.ndarray:
    data = spec.get("data")
    if not isinstance(data, list):
        raise WireError(f"output {name!r} has neither 'data' nor 'binary_data_size'")
    dtype = np.object_ if datatype == "BYTES" else DATATYPES[datatype]
    if datatype != "BYTES":
        _check_numbers(data, name, datatype)
    flat = np.asarray(data, dtype=dtype).ravel()
    if flat.size != math.prod(shape):
        raise WireError(f"output {name!r}: {flat.size} values for shape {list(shape)}")
    return flat.reshape(shape)


def _check_numbers(data: list[Any], name: str, datatype: str) -> None:
    """WireError unless every value of (nested lists) ``data`` is a JSON number of ``datatype``:
    numpy would take ``"0.51"`` and ``true`` as ``0.51`` and ``1.0``."""
    kinds: tuple[type, ...] = (bool,) if datatype == "BOOL" else (int, float)
    stack: list[Any] = [data]
    while stack:
        for value in stack.pop():
            if isinstance(value, list):
                stack.append(value)
            elif type(value) not in kinds:
                raise WireError(
                    f"output {name!r}: {datatype} data holds {json.dumps(value)[:40]}, "
                    f"not a JSON {'true/false' if datatype == 'BOOL' else 'number'}"
                )


def _binary_output(
    data: memoryview, name: str, datatype: str, shape: tuple[int, ...]
) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        try:
            items = split_length_prefixed(data, count)
        except WireError as exc:
            raise WireError(f"output {name!r}: {exc}") from exc
        out = np.empty(count, dtype=np.object_)
        out[:] = items
        return out.reshape(shape)
    dtype = DATATYPES[datatype]
    if data.nbytes != count * dtype.itemsize:
        raise WireError(
            f"output {name!r}: {data.nbytes} bytes for {datatype} shape {list(shape)} "
            f"(expected {count * dtype.itemsize})"
        )
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape)
