"""The GIL-free runner checks every input in Python before the library reads it.

Real demo packages, loaded with the package's own input checks off
(``AOTI_RUNTIME_CHECK_INPUTS=0``, read once per loaded library at its first
forward): then nothing but these checks stands between a bad input and the
library's raw reads (float16/float64 read as float32, a 3-D input read out of
bounds, a ``meta`` tensor with no memory at all).
"""

from __future__ import annotations

import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from harness.packages import demo_package
from predictor.packages.metadata import read_metadata
from predictor.runtime.aoti_runner import AotiRunError, GilFreeRunner, _check_unmoved
from predictor.runtime.input_checks import InputSpec, specs_from_cpp, specs_from_metadata

CHECKS_ENV = "AOTI_RUNTIME_CHECK_INPUTS"


@pytest.fixture(scope="module")
def embedding_pt2() -> Path:
    return demo_package("h0-mini")


def _unchecked(path: Path, **kwargs: object) -> GilFreeRunner:
    """A runner whose library has its own input checks off (read at its first forward)."""
    before = os.environ.get(CHECKS_ENV)
    os.environ[CHECKS_ENV] = "0"
    try:
        runner = GilFreeRunner(path, **kwargs)  # type: ignore[arg-type]
        runner(torch.zeros(1, 3, 224, 224))
    finally:
        if before is None:
            del os.environ[CHECKS_ENV]
        else:
            os.environ[CHECKS_ENV] = before
    return runner


@pytest.fixture(scope="module")
def runner(embedding_pt2: Path) -> Iterator[GilFreeRunner]:
    r = _unchecked(embedding_pt2)
    yield r
    r.close()


class _Subclass(torch.Tensor):
    pass


REFUSED: dict[str, tuple[Callable[[], object], str]] = {
    "float16": (lambda: torch.zeros(2, 3, 224, 224, dtype=torch.float16), "dtype must be"),
    "float64": (lambda: torch.zeros(2, 3, 224, 224, dtype=torch.float64), "dtype must be"),
    "3-D": (lambda: torch.zeros(3, 224, 224), r"must have 4 dimensions, got shape \(3, 224"),
    "meta": (lambda: torch.empty(2, 3, 224, 224, device="meta"), "must be on the CPU"),
    "empty batch": (lambda: torch.zeros(0, 3, 224, 224), r"axis 0 must be in 1\.\.256"),
    "batch over range": (lambda: torch.zeros(257, 3, 224, 224), r"axis 0 must be in 1\.\.256"),
    "wrong height": (lambda: torch.zeros(2, 3, 100, 224), "axis 2 must be 224"),
    "channels last": (
        lambda: torch.zeros(2, 3, 224, 224).to(memory_format=torch.channels_last),
        "must be contiguous",
    ),
    "subclass": (lambda: torch.zeros(2, 3, 224, 224).as_subclass(_Subclass), "plain torch"),
    "numpy": (lambda: np.zeros((2, 3, 224, 224), np.float32), "plain torch.Tensor, got ndarray"),
    "freed storage": (lambda: _freed(torch.zeros(2, 3, 224, 224)), "storage holds 0 bytes"),
    "sparse": (lambda: torch.zeros(2, 3, 224, 224).to_sparse(), "must be a dense"),
}


def _freed(tensor: torch.Tensor) -> torch.Tensor:
    tensor.untyped_storage().resize_(0)
    return tensor


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_input_is_named_and_freed(runner: GilFreeRunner, case: str) -> None:
    make, reason = REFUSED[case]
    bad = make()
    ref = weakref.ref(bad)
    message = ""
    try:
        runner(bad)
    except ValueError as exc:
        message = str(exc)
    assert message.startswith("input 0 (expected [1..256, 3, 224, 224] float32 on the CPU): ")
    assert re.search(reason, message), message
    del bad
    assert ref() is None  # nothing kept a reference: no handle was allocated for it
    assert runner(torch.zeros(1, 3, 224, 224))[0].shape == (1, 1536)  # still serving


def test_the_batch_range_edges_are_served(runner: GilFreeRunner) -> None:
    assert runner(torch.zeros(1, 3, 224, 224))[0].shape == (1, 1536)
    assert runner(torch.nn.Parameter(torch.zeros(2, 3, 224, 224)))[0].shape == (2, 1536)


def test_every_input_of_a_two_input_package_is_checked() -> None:
    path = demo_package("m-optimus")
    r = GilFreeRunner(path)
    try:
        x = torch.zeros(2, 3, 224, 224)
        with pytest.raises(ValueError, match=r"input 1 \(expected \[1\.\.256, 64\] float32"):
            r(x, torch.zeros(2, 65))
        with pytest.raises(ValueError, match="expected 2 input tensors, got 1"):
            r(x)
    finally:
        r.close()


def test_specs_from_the_generated_checks_equal_the_recorded_ones(embedding_pt2: Path) -> None:
    import zipfile

    for path in (embedding_pt2, demo_package("m-optimus"), demo_package("h0-mini", dtype="bf16")):
        with zipfile.ZipFile(path) as archive:
            (cpp,) = [n for n in archive.namelist() if n.endswith(".wrapper.cpp")]
            from_cpp = specs_from_cpp(archive.read(cpp).decode())
        assert from_cpp is not None and from_cpp == specs_from_metadata(read_metadata(path))
    assert specs_from_cpp("int main() {}") is None
    assert InputSpec(torch.float32, ((1, None), (3, 3))).describe() == "[1.., 3] float32"


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def test_rss_stays_flat_over_1000_calls(runner: GilFreeRunner) -> None:
    """1,000 forwards (inputs copied on entry) and 100 refused inputs leak nothing.

    A leaked output would be 6 kB a call (6 MB here), a leaked input 600 kB
    (600 MB): the bound sits well under the smaller.
    """
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    for _ in range(100):  # allocator and thread pools reach their steady size
        runner(x)
    before = _rss_mb()
    for i in range(1000):
        (out,) = runner(x)
        if i % 10 == 0:
            with pytest.raises(ValueError):
                runner(torch.zeros(1, 3, 224, 224, dtype=torch.float64))
    grown = _rss_mb() - before
    assert out.shape == (1, 1536)
    assert grown < 3.0, f"RSS grew {grown:.1f} MB over 1,000 calls"


def _during_a_forward(
    r: GilFreeRunner, x: torch.Tensor, meddle: Callable[[], object]
) -> torch.Tensor:
    """Runs ``r(x)`` in a thread and calls ``meddle`` on this one while it runs.

    ``meddle`` waits until the library's forward has started (tens of ms for 64
    tiles here): before it, the runner is still copying ``x``, and resizing a
    tensor while another thread copies it is the caller's own race, not the
    runner's (on a busy machine a fixed sleep landed there and crashed).
    """
    got: list[torch.Tensor] = []
    thread = threading.Thread(target=lambda: got.extend(r(x)))
    thread.start()
    deadline = time.monotonic() + 30.0
    while r._running == 0 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.0005)
    meddle()
    thread.join()
    return got[0]


def test_re_pointing_an_input_during_a_forward_does_not_reach_it(embedding_pt2: Path) -> None:
    """``private_inputs``: no copy; the library's own alias keeps the original memory."""
    r = GilFreeRunner(embedding_pt2, private_inputs=True)
    try:
        x = torch.randn(64, 3, 224, 224, generator=torch.Generator().manual_seed(1))
        want = r(x.clone())[0]
        got = _during_a_forward(r, x, lambda: x.set_(torch.zeros(8, 3, 224, 224)))
        assert torch.equal(got, want)
        assert x.shape == (8, 3, 224, 224)  # the caller's tensor did change
    finally:
        r.close()


def test_resizing_an_input_during_a_forward_is_safe_by_default(embedding_pt2: Path) -> None:
    """A growing ``resize_`` reallocates the input's memory: the default copy keeps
    the forward off it (without the copy this would read freed memory)."""
    r = GilFreeRunner(embedding_pt2)
    try:
        x = torch.randn(64, 3, 224, 224, generator=torch.Generator().manual_seed(2))
        want = r(x.clone())[0]
        got = _during_a_forward(r, x, lambda: x.resize_(256, 3, 224, 224))
        assert torch.equal(got, want)
    finally:
        r.close()


def test_only_reallocatable_inputs_are_copied(embedding_pt2: Path) -> None:
    shared, private = (
        GilFreeRunner(embedding_pt2),
        GilFreeRunner(embedding_pt2, private_inputs=True),
    )
    try:
        resizable = torch.zeros(1, 3, 224, 224)
        fixed = torch.from_numpy(np.zeros((1, 3, 224, 224), np.float32))  # cannot be resized
        assert shared._own(resizable).data_ptr() != resizable.data_ptr()
        assert shared._own(fixed).data_ptr() == fixed.data_ptr()
        assert private._own(resizable).data_ptr() == resizable.data_ptr()
    finally:
        shared.close()
        private.close()


def test_memory_moved_during_a_forward_is_detected_after_it(tmp_path: Path) -> None:
    """The post-forward check, on a storage reallocated after its pointer was taken."""
    x = torch.zeros(4)
    pointer = x.untyped_storage().data_ptr()
    _check_unmoved(tmp_path / "p.pt2", [x], [pointer])  # unmoved: nothing raised
    x.untyped_storage().resize_(1 << 20)
    with pytest.raises(AotiRunError, match="input 0's memory was reallocated during the forward"):
        _check_unmoved(tmp_path / "p.pt2", [x], [pointer])
