"""How many device workers ``--instances_per_device auto`` starts, and the threads each gets."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from predictor.device.cpus import available_cpus, resolve_instances, threads_per_instance
from predictor.device.slot import DeviceSlot
from predictor.device.workers import DeviceWorkers


@pytest.mark.parametrize(
    ("requested", "device", "cpus", "want"),
    [(None, "cpu", 2, 2), (None, "cpu", 16, 2), (None, "cpu", 1, 1), (None, "cuda", 16, 1),
     (3, "cpu", 2, 3), (4, "cuda", 2, 4)],
)  # fmt: skip
def test_auto_is_two_cpu_workers_and_one_per_gpu(requested, device, cpus, want):
    assert resolve_instances(requested, device, cpus) == want


def test_cpu_workers_split_the_cores_unless_the_user_pinned_threads():
    assert threads_per_instance("cpu", 2, 16, environ={}) == 8
    assert threads_per_instance("cpu", 3, 2, environ={}) == 1
    assert threads_per_instance("cpu", 1, 16, environ={}) is None  # torch's own count
    assert threads_per_instance("cuda", 2, 16, environ={}) is None
    assert threads_per_instance("cpu", 2, 16, environ={"OMP_NUM_THREADS": "4"}) is None


def test_available_cpus_is_at_least_one():
    assert available_cpus() >= 1


class _Normalizer:
    def for_another_worker(self) -> _Normalizer:
        return _Normalizer()

    def reserve(self, max_batch: int) -> None:
        pass


def test_each_cpu_worker_runs_its_forwards_on_its_own_thread_count():
    """OpenMP's count is per thread: the worker's setting must not leak to the caller's."""
    cpu = SimpleNamespace(device=torch.device("cpu"))
    first = DeviceSlot(package=cpu, normalizer=_Normalizer())  # type: ignore[arg-type]
    seen: dict[str, int] = {}

    def forward(samples: list[Any], mode: Any) -> list[Any]:
        seen[threading.current_thread().name] = torch.get_num_threads()
        return samples

    caller_threads = torch.get_num_threads()
    runs = DeviceWorkers().runs("cpu", first, forward, 2, cpu_threads=1)
    assert isinstance(runs, dict)
    for i, run in enumerate(runs.values()):
        thread = threading.Thread(target=run, args=([i], None), name=f"w{i}")
        thread.start()
        thread.join()
    assert seen == {"w0": 1, "w1": 1}
    assert torch.get_num_threads() == caller_threads
