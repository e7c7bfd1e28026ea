"""How many CPUs this process may use, and how the CPU is shared by device workers.

No torch here: the CLI reads :func:`available_cpus` to build its defaults
before anything heavy is imported.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

CPU_INSTANCES = 2
"""Device workers on the CPU when ``--instances_per_device`` is ``auto``: two
forwards of half the cores each kept both cores of the 2-core VM busy where one
forward of two threads left the second idle between its parallel regions
(``docs/performance.md``, "Defaults that win")."""


def available_cpus(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """CPUs this process may use: the cgroup quota in a container, else the affinity mask.

    ``os.cpu_count()`` reports the node's CPUs inside a pod, far more than its limit.
    """
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        quota, period = cgroup_cpu_max.read_text().split()[:2]
        if quota != "max":
            count = min(count or 1, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count or 1)


def resolve_instances(requested: int | None, device_type: str, cpus: int) -> int:
    """Device workers per device: ``requested``, or for ``auto`` (None) what measured best.

    On the CPU ``auto`` is :data:`CPU_INSTANCES` workers (one per CPU on a
    smaller machine); on a GPU it is 1 until the GPU check
    (``make gpu-check``) measures otherwise.
    """
    if requested is not None:
        return requested
    return min(CPU_INSTANCES, cpus) if device_type == "cpu" else 1


def threads_per_instance(
    device_type: str, instances: int, cpus: int, environ: Mapping[str, str] = os.environ
) -> int | None:
    """Intra-op threads for each CPU worker, or None to leave torch's count alone.

    Several CPU workers split the cores between them (each would otherwise
    run one thread per core, and their OpenMP regions would wait on each
    other). ``OMP_NUM_THREADS`` set by the user wins, and so does a GPU or a
    lone worker.
    """
    if device_type != "cpu" or instances < 2 or "OMP_NUM_THREADS" in environ:
        return None
    return max(1, cpus // instances)
