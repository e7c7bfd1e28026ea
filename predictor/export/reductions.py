"""Keep a package's dynamic axis whole when the graph sums over it on the CPU.

Inductor's C++ backend decides whether a float32 ``sum`` uses its cascade
(chunked, more precise) helper by *guarding* on the reduction length being
over 4096 (``CppKernel.need_use_acc_helper``). When that length is the
dynamic axis, the guard is resolved from the export example (a handful of
rows) and silently narrows the compiled range to ``N <= 4096``: a slide head
(softmax over tiles, attention pooling, a mean) exported for 1..200,000
tiles refuses every slide above 4,096. Seen with torch 2.13.

:func:`unguarded_cpu_sums` decides without a guard while it is active: a
length known statically decides as torch would; a symbolic one takes the
cascade helper (correct for any length, the precise choice for long sums).
It changes nothing else, and nothing outside the ``with``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def unguarded_cpu_sums() -> Iterator[None]:
    """Inductor's CPU sum helper chosen without narrowing the dynamic axis (see the module)."""
    try:
        from torch._inductor.codegen.cpp import CppKernel
    except ImportError:  # another torch layout: nothing to patch
        yield
        return
    original = getattr(CppKernel, "need_use_acc_helper", None)
    if original is None:
        yield
        return

    def decide(kernel: Any, reduction_type: str, dtype: Any, use_scalar: bool) -> bool:
        import functools
        import operator

        import sympy
        import torch
        from torch._inductor.virtualized import V

        if reduction_type != "sum" or dtype != torch.float or kernel.call_ranges is None:
            return original(kernel, reduction_type, dtype, use_scalar)
        size = functools.reduce(operator.mul, kernel.call_ranges[kernel.reduction_depth :])
        if not sympy.sympify(size).free_symbols:
            return original(kernel, reduction_type, dtype, use_scalar)
        return not V.graph.sizevars.statically_known_true(sympy.Le(size, 4096))

    CppKernel.need_use_acc_helper = decide
    try:
        yield
    finally:
        CppKernel.need_use_acc_helper = original
