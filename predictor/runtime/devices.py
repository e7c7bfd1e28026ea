"""The devices the server runs packages on (``--device``), and their process-wide math settings.

``--device auto`` serves on every visible GPU (one worker each), else the
CPU; ``cuda:N`` names one. Whether a package fits those devices is a fact of
the package and the host (:mod:`predictor.packages.host`); which devices
there are is read from the same :class:`~predictor.packages.host.HostFacts`,
so tests describe a GPU host they do not run on.
"""

from __future__ import annotations

import torch

from predictor.errors import StartupError
from predictor.packages.host import HostFacts


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


def resolve_devices(requested: str, host: HostFacts | None = None) -> tuple[torch.device, ...]:
    """Every device to serve on: one per visible GPU under ``auto``, else one.

    ``--device auto`` on a host with several GPUs uses all of them (one
    device worker each, one shared queue), so a pod given ``gpu.count: 2``
    leaves no GPU idle; ``cuda:N`` (and ``cuda``, ``cpu``) stay one device.

    Raises:
        StartupError: As :func:`resolve_device`.
    """
    host = host or HostFacts.detect()
    count = len(host.cuda_capabilities)
    if requested == "auto" and count > 1:
        return tuple(torch.device("cuda", i) for i in range(count))
    return (resolve_device(requested, host),)


def apply_gpu_settings(device: torch.device, input_dtype: torch.dtype, *, allow_tf32: bool) -> bool:
    """Process-wide CUDA settings for serving ``device``: TF32 for fp32 packages when asked.

    TF32 (``--allow_tf32``) applies to the matmuls and convolutions a package
    hands to cuBLAS/cuDNN at run time; Triton kernels compiled into the
    package chose their precision at export. On CUDA both switches follow
    the flag (cuDNN's is on in torch by default, so ``--allow_tf32 false``
    must switch it off); the CPU is left alone.

    Returns:
        True when TF32 was switched on.
    """
    enabled = allow_tf32 and device.type == "cuda" and input_dtype == torch.float32
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
    return enabled
