"""The V2 binary writer: requests (and any body) from arrays and encoded items.

numpy only (see :mod:`histoserve.wire`). Numeric tensors are written with one
``tobytes``; ``BYTES`` items get their length prefixes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from histoserve.wire.format import DATATYPES, HEADER, length_prefixed

_BY_KIND = {(dt.kind, dt.itemsize): name for name, dt in DATATYPES.items()}

Tensor = np.ndarray | Sequence[bytes]
"""An input: a numeric array, or encoded items (``bytes``) for a ``BYTES`` tensor."""


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
