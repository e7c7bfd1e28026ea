"""Benchmark packages: random-weight demo ``.pt2`` packages, compiled once and cached.

Uses the harness's package cache (:func:`harness.packages.demo_package`, under
``.cache/test-packages/``, keyed by spec, preset, options, torch version, CPU
instruction sets and the exporter's source), so a second ``make bench``
compiles nothing and the tiny demo package is shared with ``make test``.
"""

from __future__ import annotations

from pathlib import Path

from bench.profiles import ModelCase
from harness.packages import demo_package
from predictor.packages.host import read_cpu_flags

_NATIVE_BF16 = ("amx_bf16", "avx512_bf16")


def resolve_dtype(case: ModelCase, device: str) -> str:
    """The package dtype: ``auto`` is bf16 on GPUs and on CPUs with native bf16, else fp32."""
    if case.dtype != "auto":
        return case.dtype
    if device.startswith("cuda") or any(f in read_cpu_flags() for f in _NATIVE_BF16):
        return "bf16"
    return "fp32"


def package_for(case: ModelCase, device: str) -> Path:
    """The cached package for ``case`` on ``device`` (built on first use; minutes for ViT-g)."""
    opts: dict[str, str] = {}
    dtype = resolve_dtype(case, device)
    if dtype != "fp32":
        opts["dtype"] = dtype
    if device.startswith("cuda"):
        opts["device"] = device
    return demo_package(case.spec, case.preset, **opts)
