"""A package's build key: what it was built from and for, as one stable name.

An AOTInductor package runs only under the torch release, CUDA version and GPU
architecture (or CPU instruction sets) it was exported with, and it computes
one model's features: its spec, its weights, its dtype. :class:`BuildKey`
holds those facts; :attr:`BuildKey.name` renders them as a file-name-safe
string (``h0-mini_w3f9a1c2b4d5e_fp32_b1-256_torch2.13.0_cpu_x86-64-v3``),
the package's name in a package set (``histoserve export --package_set``).
The exporter also records the key in the package's metadata
(:data:`BUILD_KEY_KEY`), but a recorded key is a claim: the key every reader
uses is derived, at read time, from what the package says of itself
(:func:`key_from_metadata`: its embedded spec, its provenance's weights
digest, dtype, batch range and torch/CUDA versions, its tile input's dtype,
its CPU build and GPU architecture as torch recorded them). A recorded key
that contradicts those facts is refused, naming each field
(:func:`check_build_facts`); packages exported before the key was recorded
get the same derived key.

The target is ``x86-64-v3`` for the portable CPU build and ``native-<digest>``
for a CPU build with ``-march=native``: the digest (8 hex digits) names the
instruction-set flags it was compiled for, so native packages of two CPU
kinds never share a name. A CUDA package's host code is compiled for a CPU
target too, so its target is both: ``sm_90+native-<digest>`` or
``sm_90+x86-64-v3`` (two GPU nodes of one kind with different CPUs need two
packages).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from predictor.errors import CheckpointError
from predictor.packages.dtypes import short_dtype_name
from predictor.packages.metadata import (
    BUILD_KEY_KEY,
    CPU_BUILD_KEY,
    INPUTS_KEY,
    loads_metadata,
    provenance,
    read_field,
)
from predictor.spec import METADATA_KEY

__all__ = [
    "BUILD_KEY_KEY",
    "BuildKey",
    "check_build_facts",
    "contradictions",
    "key_from_metadata",
    "recorded_key",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9.+-]+")
_NAMED_WEIGHTS_CHARS = 12


@dataclass(frozen=True)
class BuildKey:
    """What a package was built from and for.

    Attributes:
        spec: The spec's name.
        weights: ``sha256:<hex>`` of the weights file, or the source's label
            when it had none (``demo:tiny``: seeded demo weights;
            ``module:pkg.mod:f``: whatever the factory builds).
        dtype: ``fp32``, ``fp16`` or ``bf16``.
        min_batch: Smallest batch the package accepts.
        max_batch: Largest batch the package accepts.
        torch: The torch release that exported it (``2.13.0``, build tag aside).
        cuda: The CUDA version of a CUDA package (``12.8``); ``None`` on the CPU.
        target: ``x86-64-v3`` or ``native-<flags digest>``; for CUDA
            ``sm_XX+`` either.
    """

    spec: str
    weights: str
    dtype: str
    min_batch: int
    max_batch: int
    torch: str
    cuda: str | None
    target: str

    @property
    def name(self) -> str:
        """The key as a file name stem: only ``[A-Za-z0-9._-]``, fields joined by ``_``."""
        device = f"cu{self.cuda}" if self.cuda else "cpu"
        fields = (
            self.spec,
            _weights_field(self.weights),
            self.dtype,
            f"b{self.min_batch}-{self.max_batch}",
            f"torch{self.torch}",
            device,
            self.target,
        )
        return "_".join(_UNSAFE.sub("-", f).strip("-") or "x" for f in fields)

    @property
    def weights_sha256(self) -> str | None:
        """The weights file's hex SHA-256, when the package was built from one."""
        return self.weights.removeprefix("sha256:") if self.weights.startswith("sha256:") else None

    @property
    def model(self) -> tuple[str, str, str]:
        """What decides the features: spec, weights and dtype (not where it runs)."""
        return self.spec, self.weights, self.dtype

    def to_json(self) -> str:
        """The fields as sorted JSON (what :data:`BUILD_KEY_KEY` holds)."""
        return json.dumps(asdict(self), sort_keys=True)

    def as_dict(self) -> dict[str, Any]:
        """The fields plus ``name``, for ``/v2/models/{name}/config`` and logs."""
        return {"name": self.name, **asdict(self)}

    def for_host(self, torch_release: str, cuda: str | None, target: str) -> BuildKey:
        """The same model built for another runtime and target."""
        return replace(self, torch=torch_release, cuda=cuda, target=target)


def _weights_field(weights: str) -> str:
    if weights.startswith("sha256:"):
        return "w" + weights.removeprefix("sha256:")[:_NAMED_WEIGHTS_CHARS]
    if len(weights) <= 40:
        return weights
    return "s" + hashlib.sha256(weights.encode()).hexdigest()[:_NAMED_WEIGHTS_CHARS]


def weights_id(source: str, weights_sha256: str | None) -> str:
    """The key's ``weights``: the weights file's digest, else the source's label."""
    return f"sha256:{weights_sha256}" if weights_sha256 else source


def torch_release(version: str) -> str:
    """``2.13.0`` of ``2.13.0+cu128``: the build tag names the CUDA, kept apart."""
    return version.split("+", 1)[0]


def native_target(isa_flags: Iterable[str]) -> str:
    """``native-<8 hex>``: a ``-march=native`` build for exactly these instruction sets."""
    blob = " ".join(sorted(set(isa_flags))).encode()
    return f"native-{hashlib.sha256(blob).hexdigest()[:8]}"


def cpu_target_name(cpu_target: str, isa_flags: Iterable[str]) -> str:
    """The key's target for a CPU build (``native`` resolved to its flags' digest)."""
    return native_target(isa_flags) if cpu_target == "native" else cpu_target


def gpu_target(capability: str, cpu_target: str) -> str:
    """A CUDA package's target: its GPU architecture and its host code's CPU target."""
    return f"sm_{capability}+{cpu_target}"


def spec_name(spec_text: str) -> str:
    """The ``name`` of a package's embedded spec (``?`` when it has none)."""
    data = loads_metadata(spec_text, "the package's embedded spec")
    return str(data.get("name", "?")) if isinstance(data, dict) else "?"


def key_from_metadata(metadata: Mapping[str, str]) -> BuildKey | None:
    """The package's build key, derived from what the package says of itself.

    Never the recorded key (:data:`BUILD_KEY_KEY`, a claim:
    :func:`check_build_facts` compares the two). Returns ``None`` for
    packages histoserve did not export (no provenance or no embedded spec):
    their facts are still checked against the host, they just have no key.

    Raises:
        CheckpointError: A field is not of its type (:mod:`predictor.packages.metadata`).
    """
    prov = provenance(metadata)
    spec_text = metadata.get(METADATA_KEY)
    if not prov.get("torch_version") or not spec_text:
        return None
    cuda = metadata.get("AOTI_DEVICE_KEY") == "cuda"
    build = read_field(metadata, CPU_BUILD_KEY)
    target = cpu_target_name(
        str(build.get("march", prov.get("cpu_target", "native"))),
        build.get("required_flags", ()),
    )
    if cuda:
        target = gpu_target(metadata.get("AOTI_COMPUTE_CAPABILITY") or "?", target)
    return BuildKey(
        spec=spec_name(spec_text),
        weights=weights_id(str(prov.get("source", "?")), prov.get("weights_sha256")),
        dtype=_short_dtype(prov.get("dtype") or _input_dtype(metadata) or "?"),
        min_batch=int(prov.get("min_batch", 1)),
        max_batch=int(prov.get("max_batch", 0)),
        torch=torch_release(str(prov["torch_version"])),
        cuda=(prov.get("cuda_version") or None) if cuda else None,
        target=target,
    )


def recorded_key(metadata: Mapping[str, str]) -> BuildKey | None:
    """The build key the package records (:data:`BUILD_KEY_KEY`), a claim; ``None`` without one.

    Raises:
        CheckpointError: The record is not of its type.
    """
    record = read_field(metadata, BUILD_KEY_KEY)
    return BuildKey(**record) if record is not None else None


_WHERE = {
    "spec": "the name of its embedded spec",
    "weights": "its provenance's weights_sha256, else its source",
    "dtype": "its provenance's dtype",
    "min_batch": "its provenance's min_batch",
    "max_batch": "its provenance's max_batch",
    "torch": "its provenance's torch_version",
    "cuda": "its provenance's cuda_version (CUDA packages only, by AOTI_DEVICE_KEY)",
    "target": "its histoserve.cpu_build and AOTI_COMPUTE_CAPABILITY",
}


def contradictions(metadata: Mapping[str, str]) -> list[str]:
    """Each place where the package's claims about its build disagree with its facts.

    The recorded key field by field against the derived one, the provenance's
    dtype against the tile input's recorded dtype, the provenance's device
    against torch's ``AOTI_DEVICE_KEY``. Empty when they agree.

    Raises:
        CheckpointError: A field is not of its type.
    """
    found = []
    prov = provenance(metadata)
    derived = key_from_metadata(metadata)
    claimed = recorded_key(metadata)
    if claimed is not None and derived is None:
        found.append("it records a build key but no provenance and spec to derive one from")
    elif claimed is not None and derived is not None:
        for name in BUILD_KEY_FIELD_NAMES:
            said, fact = getattr(claimed, name), getattr(derived, name)
            if said != fact:
                found.append(
                    f"{name} {said!r} in its recorded build key but {fact!r} by {_WHERE[name]}"
                )
    tile = _input_dtype(metadata)
    if prov.get("dtype") and tile and _short_dtype(prov["dtype"]) != _short_dtype(tile):
        found.append(
            f"dtype {prov['dtype']!r} in its provenance but its tile input ({INPUTS_KEY}) is {tile!r}"
        )
    kind = metadata.get("AOTI_DEVICE_KEY")
    if prov.get("device") and kind and prov["device"] != kind:
        found.append(f"device {prov['device']!r} in its provenance but AOTI_DEVICE_KEY {kind!r}")
    return found


def check_build_facts(metadata: Mapping[str, str], what: str = "the package") -> None:
    """Refuses a package whose claims about its build contradict its own facts.

    Raises:
        CheckpointError: One line naming ``what`` and every contradicting field.
    """
    found = contradictions(metadata)
    if found:
        raise CheckpointError(
            f"{what} lies about its build: {'; '.join(found)}. What to do: a package's "
            f"metadata was edited after export; remove it and export it again with "
            f"`histoserve export`"
        )


BUILD_KEY_FIELD_NAMES = tuple(f.name for f in fields(BuildKey))


def _input_dtype(metadata: Mapping[str, str]) -> str | None:
    inputs = read_field(metadata, INPUTS_KEY)
    return str(inputs[0]["dtype"]) if inputs else None


def _short_dtype(name: str) -> str:
    """``fp32`` of ``fp32``, ``float32`` or ``torch.float32`` (unknown names as they are)."""
    try:
        return short_dtype_name(name)
    except ValueError:
        return name
