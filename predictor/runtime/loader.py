"""Loading a ``.pt2`` package onto its device, once, behind one callable: :class:`LoadedPackage`.

Start-up first learns the package's facts without loading it
(:mod:`predictor.packages.facts`: the candidates, the one SHA-256, the
metadata), then :func:`open_package` checks the host can run it
(:mod:`predictor.packages.host`) and loads it. The probe that checks outputs
against the spec is :mod:`predictor.runtime.probe`, run by the model's family.
The load's duration is the ``load`` phase of
:class:`~predictor.packages.phases.StartupPhases`.

Loading extracts the package's files (the ``.so`` and its weights) into a
fresh ``$TMPDIR/aotinductor_XXXXXX`` directory (``/tmp`` when ``TMPDIR`` is
unset), removed when the package is freed; torch also creates its inductor
cache at ``$TORCHINDUCTOR_CACHE_DIR`` (default ``$TMPDIR/torchinductor_<user>``).
Under a read-only root filesystem both must point at writable volumes.
With torch's loader (``--forward_runner torch``) extraction and loading are
one C++ call, so they are one phase, ``load`` (= extraction + load; splitting
them would mean reimplementing torch's loader). The GIL-free runner
(``--forward_runner gil_free``, and the default ``auto`` on the CPU) extracts the model library itself, so there
its own ``extraction`` phase is recorded and ``load`` is the rest (host
checks, ``dlopen``, creating the model container). Phases are exclusive: a
phase timed inside another is not counted in the outer one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from predictor.errors import CheckpointError
from predictor.packages.facts import PackageFacts
from predictor.packages.host import HostFacts, check_host_compat
from predictor.packages.metadata import (
    embedded_spec,
    package_input_dtype,
    provenance,
    read_metadata,
)
from predictor.packages.phases import StartupPhases
from predictor.runtime.device_context import on_device
from predictor.runtime.runners import load_kind
from predictor.spec import ModelSpec

logger = logging.getLogger("histoserve")

CHECK_INPUTS_ENV = "AOTI_RUNTIME_CHECK_INPUTS"


@dataclass(frozen=True)
class LoadedPackage:
    """A loaded package, callable on a batch.

    Attributes:
        path: The ``.pt2`` file.
        metadata: Its AOTInductor metadata (strings), as the loader reports it.
        embedded_spec: The spec the package carries, or ``None``.
        device: The device it runs on.
        input_dtype: Dtype of its first (tile) input.
        runner: The loaded model: torch's, or a
            :class:`~predictor.runtime.aoti_runner.GilFreeRunner`.
        phases: The start-up phases so far (the model adds its own).
        sha256: Its hex SHA-256 when start-up hashed it, else ``""``.
        choice: How start-up chose it among the model directory's packages
            (:meth:`predictor.packages.package_set.PackageChoice.as_dict`), else ``{}``.
    """

    path: Path
    metadata: Mapping[str, str]
    embedded_spec: ModelSpec | None
    device: torch.device
    input_dtype: torch.dtype
    runner: Any = field(repr=False, compare=False)
    phases: StartupPhases = field(default_factory=StartupPhases, repr=False, compare=False)
    sha256: str = ""
    choice: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Runs the package; always a flat tuple of outputs, primary first.

        Outputs may be padded along the batch axis (some vendor packages pad
        to a fixed batch); callers trim to their batch size. Runs with the
        package's device current (:func:`~predictor.runtime.device_context.on_device`),
        keeping the stream a worker made current for it.
        """
        with on_device(self.device):
            out = self.runner(*inputs)
        if getattr(self.runner, "flat", False):
            return out
        return tuple(torch.utils._pytree.tree_leaves(out))

    @property
    def forward_runner(self) -> str:
        """Which runner serves it: ``gil_free`` or ``torch`` (``auto`` resolved)."""
        return str(getattr(self.runner, "forward_runner", "torch"))


def open_package(
    path: Path,
    device: torch.device,
    facts: PackageFacts,
    phases: StartupPhases,
    *,
    host: HostFacts | None = None,
    runner: str = "torch",
    instances: int = 1,
) -> LoadedPackage:
    """Checks the host can run the package, then loads it (``facts`` from :func:`inspect_package`).

    Raises:
        IncompatiblePackage: Built for another device kind, CPU ISA or GPU.
        CheckpointError: The loader fails.
    """
    with phases.time("load"):
        check_host_compat(facts.metadata, device, host)
        package = load_package(
            path, device, metadata=facts.metadata, phases=phases, runner=runner, instances=instances
        )
        return replace(package, sha256=facts.sha256)


def load_package(
    path: Path,
    device: torch.device,
    *,
    check_inputs: bool | None = None,
    metadata: Mapping[str, str] | None = None,
    phases: StartupPhases | None = None,
    runner: str = "torch",
    instances: int = 1,
) -> LoadedPackage:
    """Loads a package onto ``device`` with no checks (start-up uses :func:`open_package`).

    Packages histoserve exported accept batch 1 with AOTInductor's input
    checks on, so for them (``check_inputs=None``) the checks are switched on
    (``AOTI_RUNTIME_CHECK_INPUTS=1`` unless already set; process-wide): a wrong
    shape, dtype or batch size is then a clean error, not memory corruption.

    Args:
        path: The ``.pt2`` file.
        device: Where it runs.
        check_inputs: Force AOTInductor's input checks on or off.
        metadata: The package's metadata when already read (else read here).
        phases: Where start-up records its phases; a fresh record when None.
        runner: ``torch`` (torch's loader), ``gil_free``
            (:class:`~predictor.runtime.aoti_runner.GilFreeRunner`, CPU only)
            or ``auto`` (``gil_free`` on the CPU where it can serve the
            package, else torch's; see :func:`_load_runner`).
        instances: Model copies in the container, so that many threads run
            forwards at once (``--instances_per_device``).

    Raises:
        CheckpointError: The package cannot be loaded (wraps the loader's error).
    """
    path = Path(path)
    device = torch.device(device)
    metadata = dict(metadata) if metadata is not None else read_metadata(path)
    if check_inputs is None:
        check_inputs = bool(provenance(metadata).get("batch1_input_checks"))
    if check_inputs:
        os.environ.setdefault(CHECK_INPUTS_ENV, "1")
    phases = phases if phases is not None else StartupPhases()
    try:
        with on_device(device):  # the container sets the device and never restores it
            loaded = _load_runner(path, device, runner, instances, metadata=metadata, phases=phases)
        metadata = dict(loaded.get_metadata())
    except Exception as exc:
        raise CheckpointError(f"cannot load package {path}: {exc}") from exc
    return LoadedPackage(
        path=path,
        metadata=metadata,
        embedded_spec=embedded_spec(metadata),
        device=device,
        input_dtype=package_input_dtype(metadata),
        runner=loaded,
        phases=phases,
    )


def _load_runner(
    path: Path,
    device: torch.device,
    kind: str = "torch",
    instances: int = 1,
    *,
    metadata: Mapping[str, str] | None = None,
    phases: StartupPhases | None = None,
) -> Any:
    """``aoti_load_package`` without its device-info probe, when torch allows.

    ``kind="gil_free"`` loads :class:`~predictor.runtime.aoti_runner.GilFreeRunner`
    instead (CPU only; it refuses another device with a ``ValueError``),
    handing it the metadata already read (not read again) and timing its
    extraction as the ``extraction`` phase. ``kind="auto"`` (the server's
    default) is ``gil_free`` on the CPU, falling back to torch's loader with
    one warning line when the runner refuses the package (a proxy-executor
    package, no input specs, ...), and torch's loader on a GPU.

    ``torch._inductor.aoti_load_package`` first compiles small C++ programs to
    detect the host's vector ISA (only to log a warning on mismatch): ~15 s on
    a cold cache, a compiler and a writable cache dir at serving time.
    :func:`check_host_compat` already did that check from ``/proc/cpuinfo``,
    so we build the same loader it builds; on torch versions where that
    private API differs, fall back to the public call. The public call
    builds one model copy, so there ``instances`` above 1 is refused
    (``CheckpointError``): N workers would silently share one copy.
    """
    timer = phases.time if phases is not None else None
    if kind != "auto":
        return load_kind(path, device, kind, instances, metadata=metadata, timer=timer)
    if device.type != "cpu":
        return load_kind(path, device, "torch", instances)
    try:
        return load_kind(path, device, "gil_free", instances, metadata=metadata, timer=timer)
    except (ValueError, OSError, RuntimeError) as exc:  # not a bad CRC: that stops start-up
        logger.warning(
            "forward runner: the GIL-free runner cannot serve %s (%s); using torch's loader",
            path.name,
            exc,
        )
        return load_kind(path, device, "torch", instances)
