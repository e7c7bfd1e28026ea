"""Benchmark packages: random-weight demo ``.pt2`` packages, compiled once and cached.

Reuses the test suite's cache (:func:`tests.conftest.demo_package`, under
``.cache/test-packages/``, keyed by spec, preset, options, torch version, CPU
instruction sets and the exporter's source), so a second ``make bench``
compiles nothing and the tiny demo package is shared with ``make test``.
"""

from __future__ import annotations

from pathlib import Path

from bench.config import ModelCase

_NATIVE_BF16 = ("amx_bf16", "avx512_bf16")


def cpu_flags() -> set[str]:
    """The host CPU's flags from ``/proc/cpuinfo`` (empty where unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def resolve_dtype(case: ModelCase, device: str) -> str:
    """The package dtype: ``auto`` is bf16 on GPUs and on CPUs with native bf16, else fp32."""
    if case.dtype != "auto":
        return case.dtype
    if device.startswith("cuda") or any(f in cpu_flags() for f in _NATIVE_BF16):
        return "bf16"
    return "fp32"


def package_for(case: ModelCase, device: str) -> Path:
    """The cached package for ``case`` on ``device`` (built on first use; minutes for ViT-g)."""
    from tests.conftest import demo_package

    opts: dict[str, str] = {}
    dtype = resolve_dtype(case, device)
    if dtype != "fp32":
        opts["dtype"] = dtype
    if device.startswith("cuda"):
        opts["device"] = device
    return demo_package(case.spec, case.preset, **opts)
