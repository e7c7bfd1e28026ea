"""Reading a ``.pt2`` package's metadata straight from its zip, without loading it.

``aoti_compile_and_package`` stores the metadata as JSON in
``<archive>/data/aotinductor/<model>/<hash>.wrapper_metadata.json`` (a copy
sits beside the kernel as ``*.kernel_metadata.json``): the user's
``aot_inductor.metadata`` plus the build facts torch adds itself
(``AOTI_DEVICE_KEY``, ``AOTI_PLATFORM``, ``AOTI_MACHINE``, ``AOTI_CPU_ISA``,
``AOTI_COMPUTE_CAPABILITY``). histoserve's exporter adds the keys below.
Reading the zip costs milliseconds and runs none of the package's code, so
host checks happen before the shared library is ever loaded.

Every field is checked by type here, in one table (:data:`FIELDS`), when the
package is read (:func:`read_metadata`) and again by each accessor
(:func:`read_field`, :func:`provenance`): a provenance that is a list, a
``min_batch`` of ``"one"`` or a ``required_flags`` that is a number is a
:class:`~predictor.errors.CheckpointError` naming the file, the field and
what it should be, never a ``TypeError`` deeper in start-up or the exporter.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from predictor.errors import CheckpointError
from predictor.packages.dtypes import dtype_from_name
from predictor.spec import METADATA_KEY, ModelSpec, spec_from_json

if TYPE_CHECKING:
    import torch

PROVENANCE_KEY = "histoserve.provenance"
INPUTS_KEY = "histoserve.inputs"
OUTPUTS_KEY = "histoserve.outputs"
CPU_BUILD_KEY = "histoserve.cpu_build"
BUILD_KEY_KEY = "histoserve.build_key"
"""Metadata key of the recorded build key (JSON of
:class:`~predictor.packages.build_key.BuildKey`'s fields)."""
MAX_METADATA_BYTES = 4 << 20
"""The most bytes of AOTInductor metadata read from a package: a spec (at most
:data:`~predictor.spec.MAX_SPEC_BYTES`), provenance and input specs are kilobytes."""


def read_metadata(path: Path, model_name: str = "model") -> dict[str, str]:
    """The AOTInductor metadata of a package, read from the zip without loading it.

    Same content as the loaded package's ``get_metadata()`` (see the module
    docstring for where it lives).

    Raises:
        CheckpointError: Not a zip (corrupt or truncated), no AOTInductor
            metadata inside, or metadata that is not a JSON object of strings.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            member = _metadata_member(archive.namelist(), model_name, path)
            data = json_member(archive, member, f"checkpoint {path}: metadata {member}")
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path} is not a readable .pt2 package (corrupt or truncated zip): {exc}"
        ) from exc
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise CheckpointError(
            f"checkpoint {path}: metadata {member} is not a JSON object of strings"
        )
    try:
        check_fields(data)
    except CheckpointError as exc:
        raise CheckpointError(f"checkpoint {path}: {exc}") from exc
    return data


def _metadata_member(names: Sequence[str], model_name: str, path: Path) -> str:
    folder = f"data/aotinductor/{model_name}/"
    found = [n for n in names if folder in n and n.endswith("_metadata.json")]
    found.sort(key=lambda n: (not n.endswith("wrapper_metadata.json"), n))
    if not found:
        raise CheckpointError(
            f"checkpoint {path} holds no AOTInductor model {model_name!r} "
            f"(no {folder}*_metadata.json); was it made with aoti_compile_and_package?"
        )
    return found[0]


def embedded_spec(metadata: Mapping[str, str]) -> ModelSpec | None:
    """The spec a package carries under :data:`~predictor.spec.METADATA_KEY`, if any."""
    text = metadata.get(METADATA_KEY)
    return spec_from_json(text, f"package metadata {METADATA_KEY!r}") if text else None


def provenance(metadata: Mapping[str, str]) -> dict[str, Any]:
    """The package's build provenance (``{}`` for packages histoserve did not build), checked."""
    return dict(read_field(metadata, PROVENANCE_KEY))


def package_input_dtype(metadata: Mapping[str, str]) -> torch.dtype:
    """Dtype of the tile input: from ``histoserve.inputs``, then provenance, else fp32.

    Raises:
        CheckpointError: The recorded dtype is not in :mod:`predictor.packages.dtypes`.
    """
    inputs = read_field(metadata, INPUTS_KEY)
    name = inputs[0]["dtype"] if inputs else provenance(metadata).get("dtype", "float32")
    try:
        return dtype_from_name(str(name))
    except ValueError as exc:
        raise CheckpointError(f"package input dtype: {exc}") from exc


# -- the one table of field types ------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    """A field's type: what it must be (for messages) and the test."""

    what: str
    test: Callable[[Any], bool]


def _is_int(low: int) -> Kind:
    return Kind(
        f"an integer >= {low}",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low,
    )


STR = Kind("a string", lambda v: isinstance(v, str))
OPTIONAL_STR = Kind("a string or null", lambda v: v is None or isinstance(v, str))
BOOL = Kind("true or false", lambda v: isinstance(v, bool))
BATCH = _is_int(1)
SHA256 = Kind(
    "a 64-digit hex SHA-256 or null",
    lambda v: (
        v is None
        or (isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v))
    ),
)
DTYPE = Kind("a dtype name (fp32, fp16, bf16)", lambda v: isinstance(v, str) and _dtype_ok(v))
STRINGS = Kind(
    "a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)
)
SHAPE = Kind(
    "a list of integers (-1: the batch axis)",
    lambda v: (
        isinstance(v, list)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= -1 for n in v)
    ),
)


def _dtype_ok(name: str) -> bool:
    try:
        dtype_from_name(name)
    except ValueError:
        return False
    return True


PROVENANCE_FIELDS: Mapping[str, Kind] = {
    "torch_version": STR,
    "cuda_version": OPTIONAL_STR,
    "source": STR,
    "weights_sha256": SHA256,
    "dtype": DTYPE,
    "device": STR,
    "min_batch": BATCH,
    "max_batch": BATCH,
    "cpu_target": STR,
    "batch1_input_checks": BOOL,
    "created_utc": STR,
    "weights_layout": STR,
}
"""``histoserve.provenance``'s fields (others are kept, never read)."""
CPU_BUILD_FIELDS: Mapping[str, Kind] = {"march": STR, "required_flags": STRINGS}
TENSOR_FIELDS: Mapping[str, Kind] = {"name": STR, "shape": SHAPE, "dtype": STR}
"""Each entry of ``histoserve.inputs`` / ``histoserve.outputs`` (all three required)."""
BUILD_KEY_FIELDS: Mapping[str, Kind] = {
    "spec": STR,
    "weights": STR,
    "dtype": STR,
    "min_batch": BATCH,
    "max_batch": BATCH,
    "torch": STR,
    "cuda": OPTIONAL_STR,
    "target": STR,
}
"""The recorded build key: exactly these fields (:class:`~predictor.packages.build_key.BuildKey`)."""


def _object(value: Any, kinds: Mapping[str, Kind], where: str, *, exact: bool) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CheckpointError(f"{where} is {_json_type(value)}, expected a JSON object")
    if exact and set(value) != set(kinds):
        missing, extra = sorted(set(kinds) - set(value)), sorted(set(value) - set(kinds))
        raise CheckpointError(
            f"{where} must have exactly the fields {sorted(kinds)} (missing {missing}, "
            f"unknown {extra})"
        )
    for name, kind in kinds.items():
        if name in value and not kind.test(value[name]):
            raise CheckpointError(f"{where}: {name} is {_shown(value[name])}, expected {kind.what}")
    return value


def _provenance(value: Any, where: str) -> dict[str, Any]:
    prov = _object(value, PROVENANCE_FIELDS, where, exact=False)
    if "min_batch" in prov and "max_batch" in prov and prov["min_batch"] > prov["max_batch"]:
        raise CheckpointError(
            f"{where}: min_batch {prov['min_batch']} is above max_batch {prov['max_batch']}"
        )
    return prov


def _tensors(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise CheckpointError(f"{where} is {_json_type(value)}, expected a JSON list")
    for index, item in enumerate(value):
        _object(item, TENSOR_FIELDS, f"{where}[{index}]", exact=False)
        missing = sorted(set(TENSOR_FIELDS) - set(item))
        if missing:
            raise CheckpointError(f"{where}[{index}] has no {', '.join(missing)}")
    return value


def _inputs(value: Any, where: str) -> list[dict[str, Any]]:
    tensors = _tensors(value, where)
    if tensors and not DTYPE.test(tensors[0]["dtype"]):
        raise CheckpointError(
            f"{where}[0] (the tile input): dtype is {_shown(tensors[0]['dtype'])}, "
            f"expected {DTYPE.what}"
        )
    return tensors


def _spec(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CheckpointError(f"{where} is {_json_type(value)}, expected a JSON object")
    return value


FIELDS: Mapping[str, tuple[Any, Callable[[Any, str], Any]]] = {
    PROVENANCE_KEY: ({}, _provenance),
    INPUTS_KEY: ([], _inputs),
    OUTPUTS_KEY: ([], _tensors),
    CPU_BUILD_KEY: ({}, lambda v, w: _object(v, CPU_BUILD_FIELDS, w, exact=False)),
    BUILD_KEY_KEY: (None, lambda v, w: _object(v, BUILD_KEY_FIELDS, w, exact=True)),
    METADATA_KEY: (None, _spec),
}
"""Every JSON field histoserve reads: its default when absent and its check."""


def read_field(metadata: Mapping[str, str], key: str) -> Any:
    """A JSON field of :data:`FIELDS`, parsed and checked by type (its default when absent).

    Raises:
        CheckpointError: Not JSON, too large, or not of its type; the message
            names the field, the part that is wrong and what it should be.
    """
    default, check = FIELDS[key]
    text = metadata.get(key)
    if not text:
        return default
    where = f"package metadata {key!r}"
    return check(loads_metadata(text, where), where)


def check_fields(metadata: Mapping[str, str]) -> None:
    """Checks every field of :data:`FIELDS` the metadata holds (what :func:`read_metadata` runs).

    Raises:
        CheckpointError: The first field that is not of its type (the embedded
            spec only as a JSON object: ``--spec`` may replace it, and
            :func:`~predictor.spec.spec_from_json` checks the rest).
    """
    for key in FIELDS:
        read_field(metadata, key)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    text = orjson.dumps(value).decode() if _dumpable(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _dumpable(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return False
    return True


def json_member(archive: zipfile.ZipFile, member: str, where: str) -> Any:
    """A metadata member parsed as JSON, refused before reading when it declares more
    than :data:`MAX_METADATA_BYTES` (zip's own CRC check catches a member longer than declared).

    Raises:
        CheckpointError: The member declares too many bytes, or is not JSON.
    """
    size = archive.getinfo(member).file_size
    if size > MAX_METADATA_BYTES:
        raise CheckpointError(
            f"{where} declares {size:,} bytes, more than the {MAX_METADATA_BYTES:,} allowed"
        )
    return loads_metadata(archive.read(member), where)


def loads_metadata(text: str | bytes, where: str) -> Any:
    """JSON from a package's metadata, bounded in bytes (:data:`MAX_METADATA_BYTES`) and
    parsed by orjson, whose nesting limit is in C (never a ``RecursionError``).

    Raises:
        CheckpointError: Too large or not JSON; the message names ``where``.
    """
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_METADATA_BYTES:
        raise CheckpointError(
            f"{where} is {size:,} bytes, more than the {MAX_METADATA_BYTES:,} allowed"
        )
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise CheckpointError(f"{where} is not valid JSON: {exc}") from exc
