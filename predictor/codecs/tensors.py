"""V2 tensor data, wherever KServe put it, to numpy arrays and byte strings.

A KServe ``InferInput`` carries its data in one of two places:

* ``_raw_data``: little-endian bytes (gRPC ``raw_input_contents``, or our
  binary-extension parser for numeric tensors);
* ``data``: a Python list (REST JSON, possibly nested; gRPC typed
  ``contents``; our parser for ``BYTES`` tensors) or, in process, an ndarray.

These helpers check shape against data size and values against the datatype's
range, and raise :class:`~predictor.errors.InvalidInput` without an input name
(the caller adds it) but with the tile when one can be named.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from histoserve import wire
from predictor.errors import InvalidInput

NUMERIC_DTYPES: Mapping[str, np.dtype] = wire.DATATYPES
"""V2 datatype to little-endian numpy dtype (the wire order of V2 binary data)."""

DATATYPES = (*NUMERIC_DTYPES, "BF16", "BYTES")
"""Every datatype the Open Inference Protocol defines (``BF16`` arrives raw only: numpy has no bfloat16)."""

_KIND_NAMES = {
    "b": "booleans",
    "f": "non-integer numbers",
    "c": "complex numbers",
    "O": "non-numeric or out-of-range values",
}


def parse_shape(shape: Any) -> tuple[int, ...]:
    """Validates a tensor shape: a list of non-negative integers."""
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in shape
    ):
        raise InvalidInput(f"shape must be a list of integers, got {shape!r:.60}")
    if any(d < 0 for d in shape):
        raise InvalidInput(f"shape {list(shape)} has a negative dimension")
    return tuple(shape)


def numeric_tensor(values: Any, raw: Any, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """One numeric input as an array of ``shape`` in ``datatype``'s dtype.

    Raw bytes are wrapped without copying (the result is a read-only view).
    JSON values are range-checked before the cast: stock KServe lets numpy
    raise ``OverflowError`` on ``UINT8 300`` and answers 500.

    Args:
        values: ``InferInput.data`` (list or ndarray), used when ``raw`` is None.
        raw: ``InferInput._raw_data`` (bytes-like) or None.
        datatype: A key of :data:`NUMERIC_DTYPES`.
        shape: The declared, already validated shape.

    Raises:
        InvalidInput: Data size differs from the shape, values are non-numeric,
            of the wrong kind (floats for an integer type) or out of range.
    """
    dtype = NUMERIC_DTYPES[datatype]
    if raw is not None:
        return _from_raw(raw, dtype, datatype, shape)
    return _from_values(values, dtype, datatype, shape)


def _from_raw(raw: Any, dtype: np.dtype, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    nbytes = memoryview(raw).nbytes
    expected = math.prod(shape) * dtype.itemsize
    if nbytes != expected:
        raise InvalidInput(
            f"shape {list(shape)} of {datatype} needs {expected} bytes, got {nbytes}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _from_values(values: Any, dtype: np.dtype, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    if isinstance(values, np.ndarray):
        arr = values
    elif isinstance(values, (list, tuple)):
        try:
            arr = np.asarray(values)
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            raise InvalidInput(f"data is not a rectangular list of numbers: {exc}") from exc
    else:
        raise InvalidInput(f"data must be a list, got {type(values).__name__}")
    if arr.size != math.prod(shape):
        raise InvalidInput(
            f"shape {list(shape)} holds {math.prod(shape)} values, data has {arr.size}"
        )
    return _cast_checked(arr, dtype, datatype, shape).reshape(shape)


def _cast_checked(
    arr: np.ndarray, dtype: np.dtype, datatype: str, shape: tuple[int, ...]
) -> np.ndarray:
    if arr.dtype == dtype:
        return arr
    kind = arr.dtype.kind
    if dtype.kind in "iu":
        if kind not in "iu":
            what = _KIND_NAMES.get(kind, "non-numeric values")
            raise InvalidInput(f"{datatype} needs integers, data has {what}")
        _check_range(arr, np.iinfo(dtype), datatype, shape)
        return arr.astype(dtype)
    if dtype.kind == "f":
        if kind not in "iuf":
            what = _KIND_NAMES.get(kind, "non-numeric values")
            raise InvalidInput(f"{datatype} needs numbers, data has {what}")
        with np.errstate(over="ignore", invalid="ignore"):
            return arr.astype(dtype)
    if kind != "b":
        raise InvalidInput(f"{datatype} needs booleans, data has {arr.dtype.name} values")
    return arr.astype(dtype)


def _check_range(arr: np.ndarray, info: np.iinfo, datatype: str, shape: tuple[int, ...]) -> None:
    flat = arr.reshape(-1)
    if flat.size == 0 or (flat.min() >= info.min and flat.max() <= info.max):
        return
    bad = int(np.flatnonzero((flat < info.min) | (flat > info.max))[0])
    index = list(np.unravel_index(bad, shape)) if shape else []
    raise InvalidInput(
        f"value {flat[bad]} at index {[int(i) for i in index]} is out of range for "
        f"{datatype} ({info.min}..{info.max})",
        tile=int(index[0]) if index else None,
    )


def bytes_elements(values: Any, raw: Any, count: int) -> list[Any]:
    """The ``count`` elements of a ``BYTES`` tensor, not yet type-checked.

    Elements are ``bytes`` (gRPC, binary extension) or ``str`` (JSON, base64).

    Raises:
        InvalidInput: The element count differs from ``count`` or the raw
            length prefixes are inconsistent (read by :mod:`histoserve.wire`).
    """
    if raw is not None:
        with reading_wire():
            return wire.split_length_prefixed(raw, count)
    if isinstance(values, np.ndarray):
        elements = values.reshape(-1).tolist()
    elif isinstance(values, (list, tuple)):
        elements = list(values)
    else:
        raise InvalidInput(f"data must be a list, got {type(values).__name__}")
    if len(elements) != count:
        raise InvalidInput(f"shape [{count}] but data has {len(elements)} elements")
    return elements


@contextmanager
def reading_wire() -> Iterator[None]:
    """Where the server reads the V2 binary layout: :class:`~histoserve.wire.WireError` to 400.

    The one place the reader's refusals (:mod:`histoserve.wire`) become
    :class:`~predictor.errors.InvalidInput`, message unchanged.
    """
    try:
        yield
    except wire.WireError as exc:
        raise InvalidInput(str(exc)) from exc
