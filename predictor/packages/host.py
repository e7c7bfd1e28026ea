"""What this host can run, and whether a package's build facts fit it.

A ``.pt2`` package holds native code. Its metadata says what it was built for:
torch writes ``AOTI_DEVICE_KEY``, ``AOTI_PLATFORM``, ``AOTI_MACHINE``,
``AOTI_CPU_ISA`` (the inductor vector ISA, e.g. ``AVX512 AVX512_VNNI AMX_TILE``)
and ``AOTI_COMPUTE_CAPABILITY`` (e.g. ``90``). Inductor also compiles all C++
(CPU kernels and the CUDA wrapper alike) with ``-march=native`` unless told
otherwise, so histoserve's exporter records the build host's instruction-set
flags under ``histoserve.cpu_build``; packages without it are checked from
``AOTI_CPU_ISA``. Running code built for instructions the CPU lacks dies with
SIGILL, not an exception, hence these checks happen before loading.

:class:`HostFacts` is injectable so tests can describe a host they do not run
on (a GPU host, a CPU without AVX-512); that fake is the only one in the suite.
Importing this module does not import torch: the facts that need it (this
runtime's versions, its GPUs) are read when a :class:`HostFacts` is made.
Which devices the server runs on is :mod:`predictor.runtime.devices`.
"""

from __future__ import annotations

import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predictor.errors import CheckpointError, IncompatiblePackage
from predictor.packages.metadata import CPU_BUILD_KEY, provenance, read_field

if TYPE_CHECKING:
    import torch

# cpuinfo flags a compiler may emit instructions for under -march=native.
_ISA_FLAG = re.compile(
    r"^(sse\d?|sse4_[12]|sse4a|ssse3|avx\w*|amx\w*|fma4?|f16c|bmi[12]|popcnt|abm|movbe|"
    r"aes|vaes|pclmulqdq|vpclmulqdq|gfni|sha_ni|adx|asimd\w*|sve\w*|fphp|fp16|bf16|i8mm)$"
)

# AOTI_CPU_ISA tokens (inductor's VecISA names) -> the cpuinfo flags its build flags need.
ISA_FLAGS: Mapping[str, frozenset[str]] = {
    "AVX2": frozenset({"avx2", "fma", "f16c"}),
    "AVX512": frozenset({"avx512f", "avx512dq", "avx512vl", "avx512bw", "fma"}),
    "AVX512_VNNI": frozenset({"avx512_vnni"}),
    "AMX_TILE": frozenset({"amx_tile", "amx_bf16", "amx_int8", "avx512_bf16"}),
    "ASIMD": frozenset({"asimd"}),
    "NEON": frozenset({"asimd"}),
    "SVE128": frozenset({"sve", "bf16"}),
    "SVE256": frozenset({"sve", "bf16"}),
}
_NO_ISA = ("", "INVALID_VEC_ISA")


@dataclass(frozen=True)
class HostFacts:
    """The facts about this host that decide which packages it can run.

    Attributes:
        platform: ``sys.platform`` (``linux``).
        machine: ``platform.machine()`` (``x86_64``, ``aarch64``).
        cpu_flags: Instruction-set flags from ``/proc/cpuinfo``.
        cuda_capabilities: Compute capability per visible GPU, as
            ``AOTI_COMPUTE_CAPABILITY`` spells it (``"90"`` for sm_90); empty
            without a usable GPU.
        torch_version: This runtime's ``torch.__version__``.
        cuda_version: This runtime's ``torch.version.cuda`` (``None`` on a CPU build).
    """

    platform: str
    machine: str
    cpu_flags: frozenset[str]
    cuda_capabilities: tuple[str, ...] = ()
    torch_version: str = field(default_factory=lambda: _torch().__version__)
    cuda_version: str | None = field(default_factory=lambda: _torch().version.cuda)

    @classmethod
    def detect(cls, cpuinfo: Path = Path("/proc/cpuinfo")) -> HostFacts:
        """The facts of the host this process runs on."""
        return cls(
            platform=sys.platform,
            machine=platform.machine(),
            cpu_flags=read_cpu_flags(cpuinfo),
            cuda_capabilities=_cuda_capabilities(),
        )


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """ISA flags of the first CPU in ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on Arm)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def isa_flags(flags: frozenset[str]) -> frozenset[str]:
    """The subset of cpuinfo flags that name instruction sets a compiler may use."""
    return frozenset(f for f in flags if _ISA_FLAG.match(f))


def _torch() -> Any:
    """torch, imported when a fact of this runtime is first read (not at import)."""
    import torch

    return torch


def _cuda_capabilities() -> tuple[str, ...]:
    torch = _torch()
    if not torch.cuda.is_available():
        return ()
    caps = []
    for index in range(torch.cuda.device_count()):
        if torch.version.hip:
            caps.append(torch.cuda.get_device_properties(index).gcnArchName.split(":", 1)[0])
        else:
            major, minor = torch.cuda.get_device_capability(index)
            caps.append(f"{major}{minor}")
    return tuple(caps)


def check_platform(metadata: Mapping[str, str], host: HostFacts) -> None:
    """Refuses a package built for another OS or CPU architecture."""
    for key, have in (("AOTI_PLATFORM", host.platform), ("AOTI_MACHINE", host.machine)):
        built = metadata.get(key)
        if built and built != have:
            raise IncompatiblePackage(
                f"package was built for {key} {built!r}; this host is {have!r}"
            )


def check_cpu_isa(
    metadata: Mapping[str, str], cpu_build: Mapping[str, Any], host: HostFacts
) -> None:
    """Refuses a package whose native code uses instructions this CPU lacks.

    Args:
        metadata: The package metadata (``AOTI_CPU_ISA``).
        cpu_build: histoserve's ``histoserve.cpu_build`` record (``required_flags``,
            ``march``), or ``{}`` for packages built elsewhere.
        host: This host's facts.
    """
    if "required_flags" in cpu_build:
        required = frozenset(cpu_build["required_flags"])
        source = f"built with -march={cpu_build.get('march', 'native')}"
    else:
        tokens = metadata.get("AOTI_CPU_ISA", "").upper().split()
        required = frozenset().union(
            *(ISA_FLAGS.get(t, frozenset()) for t in tokens if t not in _NO_ISA)
        )
        source = f"AOTI_CPU_ISA {metadata.get('AOTI_CPU_ISA')!r}"
    missing = sorted(required - host.cpu_flags)
    if missing:
        raise IncompatiblePackage(
            f"package needs CPU instructions this host lacks ({source}): missing {', '.join(missing)}; "
            f"re-export on this kind of host or with --cpu_target x86-64-v3"
        )


def check_compute_capability(metadata: Mapping[str, str], index: int, host: HostFacts) -> None:
    """Refuses a CUDA package built for another GPU architecture than ``cuda:index``."""
    built = metadata.get("AOTI_COMPUTE_CAPABILITY", "")
    if index >= len(host.cuda_capabilities):
        raise IncompatiblePackage(
            f"package needs a CUDA GPU (built for sm_{built or '?'}) but cuda:{index} is not available"
        )
    have = host.cuda_capabilities[index]
    if built and built != have:
        raise IncompatiblePackage(
            f"package was built for sm_{built} (AOTI_COMPUTE_CAPABILITY {built}) "
            f"but cuda:{index} is sm_{have}; re-export on this GPU type"
        )


def check_runtime_versions(
    metadata: Mapping[str, str], device: torch.device, host: HostFacts
) -> None:
    """Refuses a package exported with another torch (or, for CUDA, another CUDA) than this runtime's.

    A package holds code compiled against one torch's AOTInductor runtime and
    one CUDA; another one fails to load with an opaque error, or loads and
    misbehaves. Compares the versions histoserve's exporter records
    (``torch_version``, ``cuda_version`` in ``histoserve.provenance``): the
    torch release (``2.13.0``, build tag aside) always, the CUDA version for
    CUDA packages (so a CPU package exported with a CPU build of torch runs
    under the same release's CUDA build); packages without them (built
    elsewhere) are not checked.

    Raises:
        IncompatiblePackage: One line naming both sides: torch, CUDA and GPU architecture.
    """
    prov = provenance(metadata)
    built_torch = prov.get("torch_version")
    if not built_torch:
        return
    cuda = device.type == "cuda"
    built_cuda = prov.get("cuda_version") if cuda else None
    have_cuda = host.cuda_version if cuda else None
    same_torch = _release(built_torch) == _release(host.torch_version)
    if same_torch and built_cuda == have_cuda:
        return
    index = device.index or 0
    have_arch = host.cuda_capabilities[index] if index < len(host.cuda_capabilities) else "?"
    built = _runtime_line(built_torch, built_cuda, metadata.get("AOTI_COMPUTE_CAPABILITY"), cuda)
    have = _runtime_line(host.torch_version, have_cuda, have_arch, cuda)
    raise IncompatiblePackage(
        f"package was exported with {built} but this runtime has {have}; "
        f"re-export it with this runtime (a .pt2 is tied to the torch that built it)"
    )


def _release(version: str) -> str:
    """``2.13.0`` of ``2.13.0+cu130``: the build tag names the CUDA, compared on its own."""
    return version.split("+", 1)[0]


def _runtime_line(torch_version: str, cuda: str | None, arch: str | None, on_cuda: bool) -> str:
    if not on_cuda:
        return f"torch {torch_version} (cpu)"
    return f"torch {torch_version}, CUDA {cuda or 'none'}, sm_{arch or '?'}"


def check_host_compat(
    metadata: Mapping[str, str], device: torch.device | str, host: HostFacts | None = None
) -> None:
    """Refuses a package this host cannot run, before its code is loaded.

    Checks the device kind (a CUDA package on a CPU, or the reverse), the
    platform and machine, the CPU instruction sets the package's native code
    was compiled for, the GPU compute capability, and the torch and CUDA
    versions it was exported with (:func:`check_runtime_versions`).

    Raises:
        CheckpointError: The metadata has no ``AOTI_DEVICE_KEY``.
        IncompatiblePackage: Any mismatch; the message names both sides.
    """
    host = host or HostFacts.detect()
    device = _torch().device(device)
    kind = metadata.get("AOTI_DEVICE_KEY")
    if not kind:
        raise CheckpointError("package metadata has no AOTI_DEVICE_KEY; not an AOTInductor package")
    if kind != device.type:
        raise IncompatiblePackage(
            f"package was built for {kind} but the server runs on {device}; "
            f"re-export with --device {device.type} or serve on a {kind} host"
        )
    check_platform(metadata, host)
    check_cpu_isa(metadata, read_field(metadata, CPU_BUILD_KEY), host)
    if kind == "cuda":
        check_compute_capability(metadata, device.index or 0, host)
    check_runtime_versions(metadata, device, host)
