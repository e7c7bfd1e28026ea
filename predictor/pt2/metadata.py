"""Reading a ``.pt2`` package's metadata straight from its zip, without loading it.

``aoti_compile_and_package`` stores the metadata as JSON in
``<archive>/data/aotinductor/<model>/<hash>.wrapper_metadata.json`` (a copy
sits beside the kernel as ``*.kernel_metadata.json``): the user's
``aot_inductor.metadata`` plus the build facts torch adds itself
(``AOTI_DEVICE_KEY``, ``AOTI_PLATFORM``, ``AOTI_MACHINE``, ``AOTI_CPU_ISA``,
``AOTI_COMPUTE_CAPABILITY``). histoserve's exporter adds the keys below.
Reading the zip costs milliseconds and runs none of the package's code, so
host checks happen before the shared library is ever loaded.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import torch

from predictor.errors import CheckpointError
from predictor.pt2.dtypes import dtype_from_name
from predictor.spec import METADATA_KEY, ModelSpec, spec_from_json

PROVENANCE_KEY = "histoserve.provenance"
INPUTS_KEY = "histoserve.inputs"
OUTPUTS_KEY = "histoserve.outputs"
CPU_BUILD_KEY = "histoserve.cpu_build"
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
    return spec_from_json(text) if text else None


def provenance(metadata: Mapping[str, str]) -> dict[str, Any]:
    """The package's build provenance (``{}`` for packages histoserve did not build)."""
    return json_field(metadata, PROVENANCE_KEY, {})


def package_input_dtype(metadata: Mapping[str, str]) -> torch.dtype:
    """Dtype of the tile input: from ``histoserve.inputs``, then provenance, else fp32.

    Raises:
        CheckpointError: The recorded dtype is not in :mod:`predictor.pt2.dtypes`.
    """
    inputs = json_field(metadata, INPUTS_KEY, [])
    name = inputs[0].get("dtype") if inputs else provenance(metadata).get("dtype", "float32")
    try:
        return dtype_from_name(str(name))
    except ValueError as exc:
        raise CheckpointError(f"package input dtype: {exc}") from exc


def json_field(metadata: Mapping[str, str], key: str, default: Any) -> Any:
    """A JSON-valued metadata entry, or ``default`` when absent.

    Raises:
        CheckpointError: The entry is present but not valid JSON.
    """
    text = metadata.get(key)
    if not text:
        return default
    return loads_metadata(text, f"package metadata {key!r}")


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
