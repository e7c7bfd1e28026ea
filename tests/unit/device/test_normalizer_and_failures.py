"""Stage-2 helpers: device normalisation equals the reference; errors classified and wrapped right."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from predictor.device.failures import OomCounter, classify_error, counting_ooms
from predictor.device.normalizer import Normalizer
from predictor.errors import DeviceLost, ErrorKind, ForwardError, InvalidInput, forward_failure
from predictor.packages.dtypes import dtype_from_name
from predictor.spec import BUILTIN_SPECS


def _tiles(n: int, size: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


@pytest.mark.parametrize("spec_name", ["h0-mini", "tissue-seg"])
def test_normaliser_matches_reference_preprocessing(spec_name):
    spec = BUILTIN_SPECS[spec_name]
    tiles = _tiles(3, spec.tile_size)
    got = Normalizer(spec, torch.device("cpu"), torch.float32)(list(tiles))
    ref = tiles.astype(np.float32) / 255.0
    if spec.mean is not None:
        ref = (ref - np.array(spec.mean, np.float32)) / np.array(spec.std, np.float32)
    ref = ref.transpose(0, 3, 1, 2)
    assert got.shape == ref.shape and got.is_contiguous() and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-5, rtol=1e-5)


def test_normaliser_casts_to_package_dtype():
    spec = BUILTIN_SPECS["h0-mini"]
    tiles = list(_tiles(1, 224))
    assert Normalizer(spec, torch.device("cpu"), torch.bfloat16)(tiles).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"), ErrorKind.OOM),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), ErrorKind.FATAL),
        (RuntimeError("device-side assert triggered"), ErrorKind.FATAL),
        (DeviceLost("gone"), ErrorKind.FATAL),
        (RuntimeError("shape mismatch"), ErrorKind.BATCH),
        (ValueError("boom"), ErrorKind.BATCH),
        # CUDA's sticky errors (the context is unusable until the process restarts) ...
        (RuntimeError("CUDA error: the launch timed out and was terminated"), ErrorKind.FATAL),
        (RuntimeError("CUDA error: hardware stack error"), ErrorKind.FATAL),
        (RuntimeError("CUDA error: an illegal instruction was encountered"), ErrorKind.FATAL),
        (RuntimeError("CUDA error: invalid program counter"), ErrorKind.FATAL),
        # ... and one that only says work is still pending.
        (RuntimeError("CUDA error: device not ready"), ErrorKind.BATCH),
    ],
)
def test_classify_error(exc, kind):
    assert classify_error(exc) is kind


def test_classify_follows_the_cause_chain():
    try:
        try:
            raise RuntimeError("CUDA out of memory")
        except RuntimeError as inner:
            raise ForwardError("batch failed") from inner
    except ForwardError as outer:
        assert classify_error(outer) is ErrorKind.OOM


def test_forward_failure_wraps_once_and_keeps_histoserve_errors():
    cause = RuntimeError("kaput")
    wrapped = forward_failure(cause, name="m", n_items=5, fatal=False)
    assert isinstance(wrapped, ForwardError) and not isinstance(wrapped, DeviceLost)
    assert "batch of 5" in str(wrapped) and "kaput" in str(wrapped)
    assert wrapped.__cause__ is cause
    fatal = forward_failure(RuntimeError("illegal memory access"), name="m", n_items=1, fatal=True)
    assert isinstance(fatal, DeviceLost)
    original = InvalidInput("x")
    assert forward_failure(original, name="m", n_items=1, fatal=False) is original
    assert isinstance(
        forward_failure(ForwardError("x"), name="m", n_items=1, fatal=True), DeviceLost
    )


def test_dtype_from_name():
    assert dtype_from_name("fp16") is torch.float16
    assert dtype_from_name("torch.bfloat16") is torch.bfloat16
    assert dtype_from_name("float32") is torch.float32
    with pytest.raises(ValueError, match="fp64"):
        dtype_from_name("fp64")


def test_the_device_layer_builds_a_packages_slot_and_normaliser(embedding_package_dir):
    """A real package loaded on the CPU: its slot's normaliser follows its device and dtype."""
    from harness.packages import package_in
    from predictor.device.slot import build_slot
    from predictor.packages.facts import inspect_package
    from predictor.packages.phases import StartupPhases
    from predictor.runtime.loader import open_package

    path, phases = package_in(embedding_package_dir), StartupPhases()
    package = open_package(path, torch.device("cpu"), inspect_package(path, phases), phases)
    spec = BUILTIN_SPECS["h0-mini"]
    slot = build_slot(package, spec)
    assert slot.package is package and slot.stream is None
    assert (slot.normalizer.device, slot.normalizer.dtype) == (package.device, package.input_dtype)
    tiles = list(_tiles(2, spec.tile_size))
    want = Normalizer(spec, torch.device("cpu"), package.input_dtype)(tiles)
    torch.testing.assert_close(slot.normalizer(tiles), want, rtol=0, atol=0)
    assert build_slot(package, spec).normalizer is not slot.normalizer  # one per slot


# The exact shape of an allocation failure inside a .pt2 package: the AOTInductor
# shim keeps the allocator's message in a thread-local and the generated code
# throws only this (torch 2.13, aoti_runtime/utils.h AOTI_TORCH_ERROR_CODE_CHECK).
SHIM_FAILURE = (
    "run_func_( container_handle_, input_handles.data(), input_handles.size(), "
    "output_handles.data(), output_handles.size(), reinterpret_cast<AOTInductorStreamHandle>"
    "(stream_handle), proxy_executor_handle_) API call failed at "
    "/pytorch/torch/csrc/inductor/aoti_runner/model_container_runner.cpp, line 156"
)
INNER_FAILURE = (
    "aoti_torch_empty_strided(2, int_array_0, int_array_1, cached_torch_dtype_bfloat16, "
    "cached_torch_device_type_cuda, this->device_idx_, &buf0_handle) API call failed at "
    "/tmp/torchinductor_root/cabc/model.wrapper.cpp, line 912"
)


class FakeAllocatorStats:
    """Stands in for ``torch.cuda.memory_stats`` (no GPU here): ``num_ooms`` rises on demand."""

    def __init__(self) -> None:
        self.num_ooms = 3
        self.devices: list[torch.device] = []

    def __call__(self, device: torch.device) -> dict[str, int]:
        self.devices.append(device)
        return {"num_ooms": self.num_ooms, "allocated_bytes.all.current": 0}


@pytest.mark.parametrize("message", [SHIM_FAILURE, INNER_FAILURE])
def test_a_package_failure_during_which_the_allocator_counted_an_oom_is_an_oom(message):
    """Only a GPU's allocator can count a real OOM; the counter is injected (the GPU check forces one)."""
    stats, device = FakeAllocatorStats(), torch.device("cuda", 1)
    counter = OomCounter(stats)
    counter.prime(device)  # when the worker is built
    assert classify_error(RuntimeError(message)) is ErrorKind.BATCH  # the text alone says nothing
    with counting_ooms(device, counter):
        pass  # a forward that succeeds reads nothing
    assert stats.devices == [device]
    with pytest.raises(torch.OutOfMemoryError) as caught, counting_ooms(device, counter):
        stats.num_ooms += 1  # the allocator failed inside the package
        raise RuntimeError(message)
    assert classify_error(caught.value) is ErrorKind.OOM
    assert message in str(caught.value) and isinstance(caught.value.__cause__, RuntimeError)
    assert stats.devices == [device, device]  # read at start, then after the failure only


def test_a_failure_without_an_oom_count_stays_what_it_was():
    stats = FakeAllocatorStats()
    counter = OomCounter(stats)
    counter.prime(torch.device("cuda", 0))
    with pytest.raises(RuntimeError) as caught, counting_ooms(torch.device("cuda", 0), counter):
        raise RuntimeError(SHIM_FAILURE)
    assert type(caught.value) is RuntimeError and classify_error(caught.value) is ErrorKind.BATCH
    sticky = RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError) as caught, counting_ooms(torch.device("cuda", 0), counter):
        stats.num_ooms += 1  # a sticky error stays fatal even if an OOM was counted
        raise sticky
    assert caught.value is sticky
    with counting_ooms(torch.device("cpu"), OomCounter(lambda d: {})):  # no counters
        pass


def test_staging_buffer_is_sized_once_for_the_largest_batch():
    """Pinned memory needs CUDA; the sizing is the same on the CPU, where this test runs."""
    spec = BUILTIN_SPECS["h0-mini"]
    normalizer = Normalizer(spec, torch.device("cpu"), torch.float32)
    normalizer.reserve(8)
    twin = normalizer.for_another_worker()
    for n in (1, 3, 8, 2):
        normalizer(list(_tiles(n, 224)))
        assert normalizer.host_buffer.shape[0] == 8  # allocated once, for 8
        if n == 1:
            first = normalizer.host_buffer.data_ptr()
        assert normalizer.host_buffer.data_ptr() == first
    twin(list(_tiles(2, 224)))
    assert twin.host_buffer.shape[0] == 8 and twin.host_buffer.data_ptr() != first
