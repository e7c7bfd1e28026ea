"""The client side of the V2 REST binary tensor extension: one writer, one reader.

A binary V2 body is a JSON header of ``Inference-Header-Content-Length`` bytes
followed by the raw data of every tensor whose parameters carry
``binary_data_size``, in tensor order. Numeric data is little-endian and
row-major; a ``BYTES`` tensor is its elements, each a 4-byte little-endian
length then the bytes. The same layout serves requests (``inputs``) and
responses (``outputs``).

Everything that writes or reads that layout outside the server (the Python
client, the benchmark's load generator, the reliability suite) goes through
this module, so a fix to the format lands once. The server's own strict parser
lives in :mod:`predictor.codecs.binary`; it refuses bad client input with a
400, whereas this reader refuses a malformed server answer with
:class:`ValueError`.

numpy only: the load generator imports this module in a process that must not
import torch or kserve. Numeric tensors are written with one ``tobytes`` and
read with ``np.frombuffer`` (no copy; the arrays are read-only views of the
body); only ``BYTES`` length prefixes are walked element by element.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

HEADER = "Inference-Header-Content-Length"
"""HTTP header carrying the JSON header's length in bytes."""

DATATYPES: Mapping[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
"""V2 numeric datatypes and their little-endian numpy dtypes (``BYTES`` is separate)."""

_BY_KIND = {(dt.kind, dt.itemsize): name for name, dt in DATATYPES.items()}
_PREFIX = struct.Struct("<I")

Tensor = np.ndarray | Sequence[bytes]
"""An input: a numeric array, or encoded items (``bytes``) for a ``BYTES`` tensor."""


def length_prefixed(items: Sequence[bytes]) -> bytes:
    """``BYTES`` raw data: each element a 4-byte little-endian length, then its bytes."""
    return b"".join(_PREFIX.pack(len(item)) + bytes(item) for item in items)


def split_length_prefixed(data: bytes | memoryview, count: int) -> list[bytes]:
    """The ``count`` elements of ``BYTES`` raw data.

    Raises:
        ValueError: A length prefix overruns the data, or bytes are left over.
    """
    view = memoryview(data).cast("B")
    items, offset = [], 0
    for index in range(count):
        if offset + 4 > view.nbytes:
            raise ValueError(f"BYTES element {index}: length prefix at byte {offset} is cut off")
        (size,) = _PREFIX.unpack_from(view, offset)
        if offset + 4 + size > view.nbytes:
            raise ValueError(
                f"BYTES element {index}: {size} bytes at byte {offset + 4} overrun "
                f"the {view.nbytes} bytes of data"
            )
        items.append(bytes(view[offset + 4 : offset + 4 + size]))
        offset += 4 + size
    if offset != view.nbytes:
        raise ValueError(f"BYTES data has {view.nbytes - offset} bytes after {count} elements")
    return items


def datatype_of(data: Tensor) -> str:
    """The V2 datatype of ``data``: from its numpy dtype, or ``BYTES`` for bytes items.

    Raises:
        ValueError: A dtype V2 has no name for (e.g. complex, unicode strings).
    """
    if not isinstance(data, np.ndarray) or data.dtype == np.object_:
        return "BYTES"
    name = _BY_KIND.get((data.dtype.kind, data.dtype.itemsize))
    if name is None:
        raise ValueError(f"no V2 datatype for numpy dtype {data.dtype}; cast it first")
    return name


def encode_tensor(name: str, data: Tensor) -> tuple[dict[str, Any], bytes]:
    """One binary tensor: its JSON header entry and its raw data.

    Args:
        name: Tensor name (``pixels``, ``tiles``, ``bulk_rna``, ...).
        data: A numeric array (written little-endian, C order) or a sequence /
            object array of ``bytes`` (a ``BYTES`` tensor of shape ``[N]``, or
            the object array's shape).

    Raises:
        ValueError: An unsupported dtype, or a ``BYTES`` element that is not bytes.
    """
    datatype = datatype_of(data)
    if datatype == "BYTES":
        items = list(np.asarray(data, dtype=np.object_).ravel()) if _is_array(data) else list(data)
        bad = next(
            (i for i, it in enumerate(items) if not isinstance(it, (bytes, bytearray))), None
        )
        if bad is not None:
            raise ValueError(f"input {name!r} element {bad}: BYTES items must be bytes")
        shape = list(data.shape) if _is_array(data) else [len(items)]
        raw = length_prefixed(items)
    else:
        shape = list(data.shape)
        raw = np.ascontiguousarray(data, dtype=DATATYPES[datatype]).tobytes()
    return tensor_entry(name, datatype, shape, len(raw)), raw


def tensor_entry(name: str, datatype: str, shape: Sequence[int], size: int) -> dict[str, Any]:
    """The JSON header entry of one binary tensor of ``size`` bytes.

    Not checked against anything: tests use it to declare datatypes, shapes
    or sizes that disagree with the data on purpose.
    """
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(shape),
        "parameters": {"binary_data_size": size},
    }


def _is_array(data: Tensor) -> bool:
    return isinstance(data, np.ndarray)


def binary_body(header: Mapping[str, Any], blobs: Sequence[bytes]) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body from a ready JSON header and the raw blobs that follow it.

    The low-level writer: :func:`encode_request` uses it, and tests use it to
    build deliberately inconsistent bodies.

    Returns:
        ``(body, headers)``: headers carry ``Inference-Header-Content-Length``
        and ``content-type: application/octet-stream``.
    """
    head = json.dumps(header, separators=(",", ":")).encode()
    headers = {HEADER: str(len(head)), "content-type": "application/octet-stream"}
    return head + b"".join(blobs), headers


def encode_request(
    inputs: Mapping[str, Tensor],
    *,
    parameters: Mapping[str, Any] | None = None,
    outputs: Sequence[str] | None = None,
    binary_outputs: bool = True,
    request_id: str | None = None,
) -> tuple[bytes, dict[str, str]]:
    """A V2 inference request with every input binary.

    Args:
        inputs: ``{name: data}`` in the order they are written (see
            :func:`encode_tensor` for ``data``).
        parameters: Request parameters (e.g. ``{"mode": "embedding"}``).
        outputs: Outputs to request by name (each with ``binary_data`` set to
            ``binary_outputs``); None asks for the model's default outputs
            with the request-level ``binary_data_output``.
        binary_outputs: Whether outputs should come back binary.
        request_id: Optional request ``id``, echoed by the server.

    Returns:
        ``(body, headers)`` ready for ``POST /v2/models/{name}/infer``.

    Raises:
        ValueError: No inputs, or an input :func:`encode_tensor` refuses.
    """
    if not inputs:
        raise ValueError("a request needs at least one input")
    encoded = [encode_tensor(name, data) for name, data in inputs.items()]
    params = dict(parameters or {})
    header: dict[str, Any] = {"inputs": [entry for entry, _ in encoded]}
    if outputs is None:
        params["binary_data_output"] = binary_outputs
    else:
        header["outputs"] = [
            {"name": name, "parameters": {"binary_data": binary_outputs}} for name in outputs
        ]
    header["parameters"] = params
    if request_id is not None:
        header["id"] = request_id
    return binary_body(header, [raw for _, raw in encoded])


def decode_response(
    body: bytes, header_length: int | str | None
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The outputs of a V2 REST response, binary or JSON, and its JSON header.

    Args:
        body: The whole response body.
        header_length: The ``Inference-Header-Content-Length`` response header
            (int or its text); None when absent (a plain JSON body).

    Returns:
        ``({name: array}, header)``. Numeric binary outputs are read-only views
        of ``body``; ``BYTES`` outputs are object arrays of ``bytes`` (binary)
        or of the JSON values (JSON).

    Raises:
        ValueError: A header length outside the body, a header that is not a
            JSON object with an ``outputs`` list, an unknown datatype, sizes
            that disagree with shapes, a body shorter or longer than the sizes.
    """
    view = memoryview(body).cast("B")
    length = _header_length(header_length, view.nbytes)
    header = _load_header(view[:length])
    offset, outputs = length, {}
    for position, spec in enumerate(_outputs_of(header)):
        name, datatype, shape = _output_fields(spec, position)
        size = (spec.get("parameters") or {}).get("binary_data_size")
        if size is None:
            outputs[name] = _json_output(spec, name, datatype, shape)
            continue
        if not isinstance(size, int) or size < 0 or offset + size > view.nbytes:
            raise ValueError(
                f"output {name!r}: binary_data_size {size!r} at byte {offset} overruns "
                f"the body of {view.nbytes} bytes"
            )
        outputs[name] = _binary_output(view[offset : offset + size], name, datatype, shape)
        offset += size
    if offset != view.nbytes:
        raise ValueError(f"response body has {view.nbytes - offset} bytes after its outputs")
    return outputs, header


def _header_length(value: int | str | None, total: int) -> int:
    if value is None:
        return total
    try:
        length = int(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{HEADER} is not an integer: {value!r:.40}") from exc
    if not 0 < length <= total:
        raise ValueError(f"{HEADER} {length} is outside the body of {total} bytes")
    return length


def _load_header(data: memoryview) -> dict[str, Any]:
    try:
        header = json.loads(bytes(data))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"response JSON header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ValueError(f"response JSON header must be an object, got {type(header).__name__}")
    return header


def _outputs_of(header: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    outputs = header.get("outputs")
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise ValueError(f"response has no 'outputs' list: {json.dumps(header)[:200]}")
    return outputs


def _output_fields(spec: Mapping[str, Any], position: int) -> tuple[str, str, tuple[int, ...]]:
    name, datatype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
    if not isinstance(name, str):
        raise ValueError(f"outputs[{position}] has no string 'name'")
    if datatype != "BYTES" and datatype not in DATATYPES:
        raise ValueError(f"output {name!r}: unknown datatype {datatype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"output {name!r}: shape must be a list of sizes, got {shape!r:.60}")
    return name, datatype, tuple(shape)


def _json_output(
    spec: Mapping[str, Any], name: str, datatype: str, shape: tuple[int, ...]
) -> np.ndarray:
    data = spec.get("data")
    if not isinstance(data, list):
        raise ValueError(f"output {name!r} has neither 'data' nor 'binary_data_size'")
    dtype = np.object_ if datatype == "BYTES" else DATATYPES[datatype]
    flat = np.asarray(data, dtype=dtype).ravel()
    if flat.size != math.prod(shape):
        raise ValueError(f"output {name!r}: {flat.size} values for shape {list(shape)}")
    return flat.reshape(shape)


def _binary_output(
    data: memoryview, name: str, datatype: str, shape: tuple[int, ...]
) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        try:
            items = split_length_prefixed(data, count)
        except ValueError as exc:
            raise ValueError(f"output {name!r}: {exc}") from exc
        out = np.empty(count, dtype=np.object_)
        out[:] = items
        return out.reshape(shape)
    dtype = DATATYPES[datatype]
    if data.nbytes != count * dtype.itemsize:
        raise ValueError(
            f"output {name!r}: {data.nbytes} bytes for {datatype} shape {list(shape)} "
            f"(expected {count * dtype.itemsize})"
        )
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape)
