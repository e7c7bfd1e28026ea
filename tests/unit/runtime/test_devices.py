"""Which device ``--device`` names on a host: hosts we do not have played by
:class:`~predictor.packages.host.HostFacts` (the suite's only fake)."""

from __future__ import annotations

import pytest
import torch

from predictor.errors import StartupError
from predictor.packages.host import HostFacts
from predictor.runtime.devices import resolve_device

CPU_HOST = HostFacts("linux", "x86_64", frozenset({"avx2"}))
GPU_HOST = HostFacts("linux", "x86_64", frozenset({"avx2"}), cuda_capabilities=("90",))


@pytest.mark.parametrize(
    ("requested", "host", "expected"),
    [
        ("auto", CPU_HOST, "cpu"),
        ("auto", GPU_HOST, "cuda:0"),
        ("cpu", GPU_HOST, "cpu"),
        ("cuda", GPU_HOST, "cuda:0"),
        ("cuda:0", GPU_HOST, "cuda:0"),
    ],
)
def test_resolve_device(requested: str, host: HostFacts, expected: str) -> None:
    assert resolve_device(requested, host) == torch.device(expected)


@pytest.mark.parametrize(
    ("requested", "host", "needle"),
    [
        ("cuda", CPU_HOST, "no usable CUDA GPU"),
        ("cuda:1", GPU_HOST, "has 1 GPU"),
        ("tpu", CPU_HOST, "'tpu'"),
        ("banana", CPU_HOST, "'banana'"),
    ],
)
def test_resolve_device_errors(requested: str, host: HostFacts, needle: str) -> None:
    with pytest.raises(StartupError, match=needle):
        resolve_device(requested, host)
