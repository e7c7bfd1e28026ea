"""Start-up side of ``.pt2`` packages: find, verify, inspect, check, load, probe.

Start-up is fail-fast: every problem is a :class:`~predictor.errors.StartupError`
with one clear line, raised before the server reports ready. The order is
:func:`find_checkpoint`, :func:`verify_sha256` (a package holds a shared library,
so loading one runs its code), :func:`read_metadata` (straight from the zip,
nothing loaded), :func:`check_host_compat`, :func:`load_package`, then
:func:`probe_outputs` and :func:`check_consistency`. This module is the facade;
metadata reading lives in :mod:`predictor.package_meta`, host facts in
:mod:`predictor.hostfacts`, the probe in :mod:`predictor.package_probe`.

Loading extracts the package's files (the ``.so`` and its metadata) into a
fresh ``$TMPDIR/aotinductor_XXXXXX`` directory (``/tmp`` when ``TMPDIR`` is
unset), removed when the package is freed; torch also creates its inductor
cache at ``$TORCHINDUCTOR_CACHE_DIR`` (default ``$TMPDIR/torchinductor_<user>``).
Under a read-only root filesystem both must point at writable volumes.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from predictor import hostfacts
from predictor.errors import CheckpointError, IncompatiblePackage, StartupError
from predictor.hostfacts import HostFacts
from predictor.package_meta import (
    CPU_BUILD_KEY,
    INPUTS_KEY,
    OUTPUTS_KEY,
    PROVENANCE_KEY,
    embedded_spec,
    json_field,
    package_input_dtype,
    provenance,
    read_metadata,
)
from predictor.package_probe import (
    InputDesc,
    check_consistency,
    declared_input_dim,
    expected_inputs,
    probe_outputs,
)
from predictor.spec import ModelSpec

__all__ = [
    "CHECK_INPUTS_ENV",
    "CPU_BUILD_KEY",
    "INPUTS_KEY",
    "OUTPUTS_KEY",
    "PROVENANCE_KEY",
    "HostFacts",
    "InputDesc",
    "LoadedPackage",
    "check_consistency",
    "check_host_compat",
    "declared_input_dim",
    "embedded_spec",
    "expected_inputs",
    "find_checkpoint",
    "load_package",
    "package_input_dtype",
    "probe_outputs",
    "provenance",
    "read_metadata",
    "resolve_device",
    "sha256_file",
    "verify_sha256",
]

logger = logging.getLogger("histoserve")

CHECK_INPUTS_ENV = "AOTI_RUNTIME_CHECK_INPUTS"
_CHUNK = 1 << 20


def find_checkpoint(model_dir: Path, checkpoint: str | None) -> Path:
    """The package to serve: ``model_dir/checkpoint``, or the only ``*.pt2`` there.

    Raises:
        CheckpointError: The directory or named file is missing, the name
            escapes the directory, or there is no or more than one ``*.pt2``
            and no name was given (the message lists the candidates).
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"model directory {model_dir} does not exist")
    if checkpoint:
        path = model_dir / checkpoint
        if Path(checkpoint).is_absolute() or ".." in Path(checkpoint).parts:
            raise CheckpointError(
                f"checkpoint {checkpoint!r} must be a file name inside {model_dir}"
            )
        if not path.is_file():
            raise CheckpointError(f"checkpoint {checkpoint!r} not found in {model_dir}")
        return path
    candidates = sorted(p for p in model_dir.glob("*.pt2") if p.is_file())
    if not candidates:
        raise CheckpointError(f"no *.pt2 checkpoint in {model_dir}")
    if len(candidates) > 1:
        names = ", ".join(p.name for p in candidates)
        raise CheckpointError(
            f"several checkpoints in {model_dir} ({names}); choose one with --checkpoint"
        )
    return candidates[0]


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, streamed in 1 MiB chunks (packages can be GBs)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: Path) -> bool:
    """Checks ``path`` against ``<path>.sha256`` when that file exists.

    The digest file holds the hex digest, optionally followed by the file name
    (``sha256sum`` format). A package holds a shared library that runs on
    load, so a mismatch stops start-up.

    Returns:
        ``True`` when a digest file was present and matched, ``False`` when
        there is none (nothing to check).

    Raises:
        CheckpointError: Unreadable or malformed digest file, or a mismatch
            (the package is tampered or truncated).
    """
    path = Path(path)
    digest_file = path.with_name(path.name + ".sha256")
    if not digest_file.exists():
        return False
    try:
        fields = digest_file.read_text(encoding="utf-8").split()
    except OSError as exc:
        raise CheckpointError(f"cannot read {digest_file}: {exc}") from exc
    expected = fields[0].lower() if fields else ""
    if len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected):
        raise CheckpointError(
            f"{digest_file} does not start with a SHA-256 hex digest: {expected!r}"
        )
    try:
        actual = sha256_file(path)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if actual != expected:
        raise CheckpointError(
            f"checkpoint {path} is tampered or truncated: sha256 {actual} != {expected} in {digest_file.name}"
        )
    return True


def resolve_device(requested: str, host: HostFacts | None = None) -> torch.device:
    """The device to serve on: ``auto`` is ``cuda`` when a GPU is visible, else ``cpu``.

    Args:
        requested: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        host: Host facts; detected when ``None`` (tests pass fakes).

    Raises:
        StartupError: Unknown device string, or CUDA asked for where there is
            no GPU (or no GPU with that index).
    """
    host = host or HostFacts.detect()
    if requested == "auto":
        return torch.device("cuda:0" if host.cuda_capabilities else "cpu")
    try:
        device = torch.device(requested)
    except (RuntimeError, ValueError) as exc:
        raise StartupError(f"unknown device {requested!r}; use auto, cpu, cuda or cuda:N") from exc
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise StartupError(f"unsupported device {requested!r}; use auto, cpu, cuda or cuda:N")
    count = len(host.cuda_capabilities)
    if count == 0:
        raise StartupError(f"--device {requested} but this host has no usable CUDA GPU")
    index = device.index or 0
    if index >= count:
        raise StartupError(
            f"--device {requested} but this host has {count} GPU(s) (cuda:0..cuda:{count - 1})"
        )
    return torch.device("cuda", index)


def check_host_compat(
    metadata: Mapping[str, str], device: torch.device, host: HostFacts | None = None
) -> None:
    """Refuses a package this host cannot run, before its code is loaded.

    Checks the device kind (a CUDA package on a CPU, or the reverse), the
    platform and machine, the CPU instruction sets the package's native code
    was compiled for, and the GPU compute capability.

    Raises:
        CheckpointError: The metadata has no ``AOTI_DEVICE_KEY``.
        IncompatiblePackage: Any mismatch; the message names both sides.
    """
    host = host or HostFacts.detect()
    device = torch.device(device)
    kind = metadata.get("AOTI_DEVICE_KEY")
    if not kind:
        raise CheckpointError("package metadata has no AOTI_DEVICE_KEY; not an AOTInductor package")
    if kind != device.type:
        raise IncompatiblePackage(
            f"package was built for {kind} but the server runs on {device}; "
            f"re-export with --device {device.type} or serve on a {kind} host"
        )
    hostfacts.check_platform(metadata, host)
    hostfacts.check_cpu_isa(metadata, json_field(metadata, CPU_BUILD_KEY, {}), host)
    if kind == "cuda":
        hostfacts.check_compute_capability(metadata, device.index or 0, host)


@dataclass(frozen=True)
class LoadedPackage:
    """A loaded package, callable on a batch.

    Attributes:
        path: The ``.pt2`` file.
        metadata: Its AOTInductor metadata (strings), as the loader reports it.
        embedded_spec: The spec the package carries, or ``None``.
        device: The device it runs on.
        input_dtype: Dtype of its first (tile) input.
    """

    path: Path
    metadata: Mapping[str, str]
    embedded_spec: ModelSpec | None
    device: torch.device
    input_dtype: torch.dtype
    runner: Any = field(repr=False, compare=False)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Runs the package; always a flat tuple of outputs, primary first.

        Outputs may be padded along the batch axis (some vendor packages pad
        to a fixed batch); callers trim to their batch size.
        """
        out = self.runner(*inputs)
        return tuple(torch.utils._pytree.tree_leaves(out))

    @property
    def batch_range(self) -> tuple[int, int] | None:
        """The batch sizes the package was exported for, when it records them."""
        prov = provenance(self.metadata)
        if "min_batch" in prov and "max_batch" in prov:
            return int(prov["min_batch"]), int(prov["max_batch"])
        return None


def load_package(
    path: Path, device: torch.device, *, check_inputs: bool | None = None
) -> LoadedPackage:
    """Loads a package onto ``device``; call only after the checks above.

    Packages histoserve exported accept batch 1 with AOTInductor's input
    checks on, so for them (``check_inputs=None``) the checks are switched on
    (``AOTI_RUNTIME_CHECK_INPUTS=1`` unless already set; process-wide): a wrong
    shape, dtype or batch size is then a clean error, not memory corruption.

    Raises:
        CheckpointError: The package cannot be loaded (wraps the loader's error).
    """
    path = Path(path)
    device = torch.device(device)
    metadata = read_metadata(path)
    if check_inputs is None:
        check_inputs = bool(provenance(metadata).get("batch1_input_checks"))
    if check_inputs:
        os.environ.setdefault(CHECK_INPUTS_ENV, "1")
    try:
        runner = _load_runner(path, device)
        metadata = dict(runner.get_metadata())
    except Exception as exc:
        raise CheckpointError(f"cannot load package {path}: {exc}") from exc
    return LoadedPackage(
        path=path,
        metadata=metadata,
        embedded_spec=embedded_spec(metadata),
        device=device,
        input_dtype=package_input_dtype(metadata),
        runner=runner,
    )


def _load_runner(path: Path, device: torch.device) -> Any:
    """``aoti_load_package`` without its device-info probe, when torch allows.

    ``torch._inductor.aoti_load_package`` first compiles small C++ programs to
    detect the host's vector ISA (only to log a warning on mismatch): ~15 s on
    a cold cache, a compiler and a writable cache dir at serving time.
    :func:`check_host_compat` already did that check from ``/proc/cpuinfo``,
    so we build the same loader it builds; on torch versions where that
    private API differs, fall back to the public call.
    """
    index = device.index if device.index is not None else (0 if device.type == "cuda" else -1)
    try:
        from torch.export.pt2_archive._package import AOTICompiledModel

        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, index)
        return AOTICompiledModel(loader)
    except (ImportError, AttributeError, TypeError):
        logger.debug("private AOTI loader unavailable; using aoti_load_package", exc_info=True)
    return torch._inductor.aoti_load_package(str(path), device_index=index)
