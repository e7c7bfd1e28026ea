"""Package sets for tests: real packages of other builds, a weights-only volume.

A package built for a GPU cannot be made here (no GPU), so
:func:`fake_gpu_package` rewrites a real CPU package's metadata to claim CUDA
and ``sm_XX`` (the one fake: the start-up rule reads metadata only, and must
refuse it on this host). :func:`rewrite_metadata` is the general tool: a copy
of a package with its metadata JSON changed (both copies torch writes, the
wrapper's and the kernel's), and a fresh ``.sha256``.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.factories import WEIGHTS_TARGET


def rewrite_metadata(
    src: Path, folder: Path, change: Callable[[dict[str, str]], None], name: str | None = None
) -> Path:
    """A copy of package ``src`` in ``folder`` whose metadata ``change`` edited in place.

    Named ``name`` (default: its build key's name, ``<key>.pt2``), with a ``.sha256``.
    """
    from predictor.export.commit import write_sha256
    from predictor.packages.build_key import key_from_metadata

    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / ".rewrite.pt2"
    metadata: dict[str, str] = {}
    with zipfile.ZipFile(src) as source, zipfile.ZipFile(staged, "w") as dest:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("_metadata.json") and "/aotinductor/" in info.filename:
                metadata = json.loads(data)
                change(metadata)
                data = json.dumps(metadata).encode()
            dest.writestr(info, data)
    if name is None:  # named by its key (a metadata edit that breaks the key needs a name)
        key = key_from_metadata(metadata)
        name = f"{key.name if key else 'package'}.pt2"
    final = folder / name
    staged.replace(final)
    write_sha256(final)
    return final


def claim(metadata: dict[str, str], **fields: Any) -> None:
    """Changes what the package says of itself, honestly: provenance fields (``created_utc``,
    ``max_batch``, ``weights_sha256``...; ``weights="sha256:<hex>"`` sets ``weights_sha256``),
    then records the build key derived from them, as an export that built it would."""
    from predictor.packages.build_key import BUILD_KEY_KEY, key_from_metadata

    prov = json.loads(metadata["histoserve.provenance"])
    for name, value in fields.items():
        if name == "weights":
            prov["weights_sha256"] = value.removeprefix("sha256:")
        elif name not in ("target", "cuda"):  # those follow from AOTI_* and cuda_version
            prov[name] = value
    metadata["histoserve.provenance"] = json.dumps(prov, sort_keys=True)
    key = key_from_metadata(metadata)
    assert key is not None
    metadata[BUILD_KEY_KEY] = key.to_json()


def lie(metadata: dict[str, str], **fields: Any) -> None:
    """Changes only the recorded build key's ``fields``: a claim its package contradicts."""
    from predictor.packages.build_key import BUILD_KEY_KEY

    key = json.loads(metadata[BUILD_KEY_KEY])
    key.update(fields)
    metadata[BUILD_KEY_KEY] = json.dumps(key, sort_keys=True)


def fake_gpu_package(src: Path, folder: Path, capability: str = "90", cuda: str = "12.8") -> Path:
    """A copy of CPU package ``src`` whose metadata claims a CUDA ``sm_<capability>`` build."""

    def to_gpu(metadata: dict[str, str]) -> None:
        metadata["AOTI_DEVICE_KEY"] = "cuda"
        metadata["AOTI_COMPUTE_CAPABILITY"] = capability
        claim(metadata, cuda_version=cuda, device="cuda")  # host code: the portable build's

    return rewrite_metadata(src, folder, to_gpu)


def write_weights(path: Path, spec_name: str = "h0-mini", seed: int = 5) -> Path:
    """A weights file (torch state dict) for :data:`harness.factories.WEIGHTS_TARGET`."""
    import torch

    from predictor.families import build_demo_model
    from predictor.spec import resolve_spec

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(build_demo_model(resolve_spec(spec_name), seed=seed).state_dict(), path)
    return path


def export_argv(volume: Path, weights: Path, *more: str) -> list[str]:
    """``histoserve export`` flags that build the weights-only volume's package into it."""
    return [
        "--spec", "h0-mini", "--module", WEIGHTS_TARGET, "--weights", str(weights),
        "--max_batch", "8", "--package_set", str(volume), "--if_missing", *more,
    ]  # fmt: skip


def three_builds(folder: Path) -> dict[str, Path]:
    """The tiny h0-mini demo as three builds in ``folder``, each named by its build key.

    ``native`` (``-march=native``, batches 1..256), ``v3`` (``x86-64-v3``,
    batches 1..8), both real and cached (:func:`harness.packages.demo_package`),
    and ``gpu``: the portable one's copy claiming CUDA 12.8 ``sm_90``.
    """
    import shutil

    from harness.packages import demo_package
    from predictor.export.commit import write_sha256
    from predictor.packages.build_key import key_from_metadata
    from predictor.packages.metadata import read_metadata

    folder.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    for label, src in (
        ("native", demo_package("h0-mini")),
        ("v3", demo_package("h0-mini", cpu_target="x86-64-v3", max_batch=8)),
    ):
        key = key_from_metadata(read_metadata(src))
        found[label] = folder / f"{key.name if key else label}.pt2"
        shutil.copy2(src, found[label])
        write_sha256(found[label])
    found["gpu"] = fake_gpu_package(found["v3"], folder)
    return found
