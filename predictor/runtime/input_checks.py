"""What a package's inputs must be, and the check the GIL-free runner makes before a forward.

A package's library reads raw memory: with its own input checks off
(``AOTI_RUNTIME_CHECK_INPUTS`` unset or ``0``) a float16 or float64 input is
read as float32 (silent garbage), a 3-D input makes it read sizes and
memory past the tensor, and a ``meta`` tensor (no memory at all) crashes the
process; even with them on, a tensor of the wrong rank is read out of bounds
(they index sizes without checking the rank). So
:class:`~predictor.runtime.aoti_runner.GilFreeRunner` checks every input
here, in Python, before the call: type, device, layout, dtype, rank, each
axis (fixed sizes and the batch range), contiguity, and that its storage
holds its bytes.

Where the specs come from, first found:

1. the package's generated ``*.wrapper.cpp`` (torch stores it beside the
   library): the ``check_input_N`` functions torch writes for its own
   checks, i.e. the dtype, fixed sizes and bounds compiled in. This is the
   truth: torch may narrow the batch range it was asked for (a demo
   segmenter exported for 1..256 compiled to 1..15 here);
2. ``histoserve.inputs`` (name, shape with ``-1`` for the batch axis, dtype;
   ``histoserve export`` writes it) with the batch range of
   ``histoserve.provenance`` (``min_batch``/``max_batch``), for a package
   shipped without its generated source.

A package with neither cannot be checked and is refused at load
(:class:`NoInputSpecs`); the server then falls back to torch's loader.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from predictor.packages.metadata import INPUTS_KEY, provenance, read_field

__all__ = ["InputSpec", "NoInputSpecs", "check_inputs", "specs_from_cpp", "specs_from_metadata"]


class NoInputSpecs(ValueError):
    """The package records nothing the runner could check its inputs against."""


@dataclass(frozen=True)
class InputSpec:
    """One input of a package.

    Attributes:
        dtype: Its dtype.
        dims: Per axis, the least and the most size allowed (equal for a
            fixed axis; the most is ``None`` when unbounded).
    """

    dtype: torch.dtype
    dims: tuple[tuple[int, int | None], ...]

    def describe(self) -> str:
        """``[1..256, 3, 224, 224] float32``: the shape a reader expects."""
        parts = [
            str(lo) if lo == hi else f"{lo}..{'' if hi is None else hi}" for lo, hi in self.dims
        ]
        return f"[{', '.join(parts)}] {str(self.dtype).removeprefix('torch.')}"


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise NoInputSpecs(f"unknown input dtype {name!r} in the package")
    return dtype


def specs_from_metadata(metadata: Mapping[str, str]) -> tuple[InputSpec, ...] | None:
    """The specs ``histoserve export`` records (``None`` when the package has none).

    Raises:
        NoInputSpecs: The entry is present but malformed.
    """
    inputs = read_field(metadata, INPUTS_KEY)
    if not inputs:
        return None
    prov = provenance(metadata)
    batch = (int(prov.get("min_batch", 1)), prov.get("max_batch"))
    batch = (batch[0], None if batch[1] is None else int(batch[1]))
    try:
        return tuple(
            InputSpec(
                _dtype(item["dtype"]),
                tuple(batch if int(n) < 0 else (int(n), int(n)) for n in item["shape"]),
            )
            for item in inputs
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise NoInputSpecs(f"malformed {INPUTS_KEY} metadata: {exc}") from exc


_FUNCTION = re.compile(r"static void check_input_(\d+)\(")
_DTYPE = re.compile(r"_expected_dtype = aoti_torch_dtype_(\w+)\(\)")
_FIXED = re.compile(r"if \((-?\d+) != \w+_size\[(\d+)\]\)")
_MOST = re.compile(r"if \(\w+_size\[(\d+)\] > (\d+)\)")
_LEAST = re.compile(r"if \(\w+_size\[(\d+)\] < (\d+)\)")
_AXIS = re.compile(r"\w+_(?:size|stride)\[(\d+)\]")


def specs_from_cpp(source: str) -> tuple[InputSpec, ...] | None:
    """The specs in torch's generated ``check_input_N`` functions (``None`` when absent)."""
    starts = [(int(m.group(1)), m.end()) for m in _FUNCTION.finditer(source)]
    if not starts or sorted(i for i, _ in starts) != list(range(len(starts))):
        return None
    specs: dict[int, InputSpec] = {}
    for n, (index, start) in enumerate(starts):
        end = starts[n + 1][1] if n + 1 < len(starts) else source.find("static bool", start)
        body = source[start : end if end > start else len(source)]
        dtype = _DTYPE.search(body)
        axes = [int(a) for a in _AXIS.findall(body)]
        if dtype is None or not axes:
            return None
        dims: list[tuple[int, int | None]] = [(1, None)] * (max(axes) + 1)  # never empty
        for size, axis in _FIXED.findall(body):
            dims[int(axis)] = (int(size), int(size))
        for axis, most in _MOST.findall(body):
            dims[int(axis)] = (dims[int(axis)][0], int(most))
        for axis, least in _LEAST.findall(body):
            dims[int(axis)] = (int(least), dims[int(axis)][1])
        specs[index] = InputSpec(_dtype(dtype.group(1)), tuple(dims))
    return tuple(specs[i] for i in range(len(specs)))


def check_inputs(specs: Sequence[InputSpec], inputs: Sequence[object]) -> None:
    """Raises ``ValueError`` naming the input and the reason unless every input fits its spec.

    Nothing is allocated for an input and no reference to one is kept, so a
    refused input is freed as soon as its caller lets it go.
    """
    if len(inputs) != len(specs):
        raise ValueError(f"expected {len(specs)} input tensors, got {len(inputs)}")
    for i, (spec, tensor) in enumerate(zip(specs, inputs, strict=True)):
        reason = _refusal(spec, tensor)
        if reason:
            raise ValueError(f"input {i} (expected {spec.describe()} on the CPU): {reason}")


def _refusal(spec: InputSpec, tensor: object) -> str | None:
    """Why ``tensor`` cannot be passed as ``spec``, or ``None``."""
    if not isinstance(tensor, torch.Tensor) or type(tensor) not in (
        torch.Tensor,
        torch.nn.Parameter,
    ):  # a subclass (fake, functional, ...) may have no memory behind it
        return f"must be a plain torch.Tensor, got {type(tensor).__name__}"
    if tensor.device.type != "cpu":
        return f"must be on the CPU, got device {tensor.device}"
    if tensor.layout != torch.strided:
        return f"must be a dense (strided) tensor, got layout {tensor.layout}"
    if tensor.dtype != spec.dtype:
        return f"dtype must be {spec.dtype}, got {tensor.dtype}"
    if tensor.dim() != len(spec.dims):
        return f"must have {len(spec.dims)} dimensions, got shape {tuple(tensor.shape)}"
    for axis, (size, (lo, hi)) in enumerate(zip(tensor.shape, spec.dims, strict=True)):
        if size < lo or (hi is not None and size > hi):
            allowed = str(lo) if lo == hi else f"in {lo}..{'' if hi is None else hi}"
            return f"axis {axis} must be {allowed}, got shape {tuple(tensor.shape)}"
    if not tensor.is_contiguous():
        return f"must be contiguous, got stride {tensor.stride()}"
    storage = tensor.untyped_storage()
    needed = (tensor.storage_offset() + tensor.numel()) * tensor.element_size()
    if tensor.numel() and (storage.data_ptr() == 0 or storage.nbytes() < needed):
        return f"its storage holds {storage.nbytes()} bytes, it needs {needed}"
    return None
