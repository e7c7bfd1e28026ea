"""The GIL-free runner: same outputs as torch's loader, and Python keeps running meanwhile.

Real demo packages (compiled once and cached by ``tests/conftest.py``). The
progress test runs a batch of 64 tiles of the tiny demo ViT (tens of ms per
forward here) and counts a busy Python thread's iterations during forwards:
through torch's loader the GIL is held, so the thread stalls; through the C
ABI it is released. Asserted on ratios, never on absolute times.
"""

from __future__ import annotations

import os
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from harness.packages import demo_package, proxy_executor_package
from predictor.packages import extract
from predictor.packages.metadata import read_metadata
from predictor.runtime import aoti_runner
from predictor.runtime.aoti_runner import AotiRunError, GilFreeRunner, extract_member


def _reference(path: Path) -> Callable[..., tuple[torch.Tensor, ...]]:
    """torch's own loader (holds the GIL), returning a flat tuple like the runner."""
    model = torch._inductor.aoti_load_package(str(path))

    def call(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.utils._pytree.tree_leaves(model(*inputs)))

    return call


@pytest.fixture(scope="module")
def embedding_pt2() -> Path:
    return demo_package("h0-mini")


@pytest.fixture
def runner(embedding_pt2: Path) -> Iterator[GilFreeRunner]:
    r = GilFreeRunner(embedding_pt2)
    yield r
    r.close()


def test_embedding_outputs_equal_the_loader(runner: GilFreeRunner, embedding_pt2: Path) -> None:
    ref = _reference(embedding_pt2)
    for batch in (1, 5):
        x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(batch))
        got, want = runner(x), ref(x)
        assert len(got) == len(want) == 1
        assert got[0].shape == (batch, 1536)
        assert torch.equal(got[0], want[0])
    assert runner.get_metadata()["AOTI_DEVICE_KEY"] == "cpu"
    assert "histoserve.spec" in runner.get_metadata()


def test_two_input_two_output_package_equals_the_loader() -> None:
    path = demo_package("m-optimus")
    gil_free = GilFreeRunner(path)
    try:
        x = torch.randn(3, 3, 224, 224, generator=torch.Generator().manual_seed(0))
        rna = torch.rand(3, 64, generator=torch.Generator().manual_seed(1))
        rna[1] = float("nan")  # "no bulk RNA for this tile" inside the graph
        got, want = gil_free(x, rna), _reference(path)(x, rna)
        assert gil_free.num_inputs == 2 and len(got) == len(want) == 2
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
    finally:
        gil_free.close()


def test_bf16_package_equals_the_loader() -> None:
    """The benchmark serves bf16 packages through this runner on AMX CPUs."""
    path = demo_package("h0-mini", dtype="bf16")
    gil_free = GilFreeRunner(path)
    try:
        x = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(2))
        x = x.to(torch.bfloat16)
        got, want = gil_free(x), _reference(path)(x)
        assert got[0].dtype == want[0].dtype
        assert torch.equal(got[0], want[0])
    finally:
        gil_free.close()


def test_non_contiguous_input_is_refused(runner: GilFreeRunner) -> None:
    x = torch.randn(2, 3, 224, 224).permute(0, 1, 3, 2)
    with pytest.raises(ValueError, match=r"input 0 \(expected .*\): must be contiguous"):
        runner(x)
    with pytest.raises(ValueError, match="expected 1 input tensors, got 2"):
        runner(x.contiguous(), x.contiguous())


def test_library_error_is_raised_with_its_message(
    runner: GilFreeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's own checks are switched off here to reach the library's."""
    # histoserve packages accept batch 1 with AOTInductor's input checks on.
    monkeypatch.setenv("AOTI_RUNTIME_CHECK_INPUTS", "1")
    monkeypatch.setattr(aoti_runner, "check_inputs", lambda specs, inputs: None)
    with pytest.raises(AotiRunError, match=r"cannot run a forward: .*expected: 224, but got: 100"):
        runner(torch.randn(2, 3, 100, 224))
    assert runner(torch.randn(1, 3, 224, 224))[0].shape == (1, 1536)  # still usable


def test_closed_runner_refuses(embedding_pt2: Path) -> None:
    r = GilFreeRunner(embedding_pt2)
    r.close()
    r.close()  # idempotent
    with pytest.raises(RuntimeError, match="runner closed"):
        r(torch.randn(1, 3, 224, 224))


def test_constructor_validates(embedding_pt2: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="CPU packages only, got device cuda"):
        GilFreeRunner(embedding_pt2, "cuda")
    with pytest.raises(ValueError, match="num_models must be >= 1, got 0"):
        GilFreeRunner(embedding_pt2, num_models=0)
    with pytest.raises(ValueError, match=r"expected one data/aotinductor/other/\*\.so"):
        GilFreeRunner(embedding_pt2, model_name="other")


def _busy_progress(forward: Callable[[], object], forwards: int) -> float:
    """Iterations per second a busy Python thread makes while ``forwards`` forwards run."""
    count = [0]
    stop = threading.Event()
    started = threading.Event()

    def spin() -> None:
        started.set()
        while not stop.is_set():
            count[0] += 1

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    started.wait()
    before, t0 = count[0], time.perf_counter()
    for _ in range(forwards):
        forward()
    after, t1 = count[0], time.perf_counter()
    stop.set()
    thread.join()
    return (after - before) / (t1 - t0)


def test_another_thread_runs_during_a_forward(runner: GilFreeRunner, embedding_pt2: Path) -> None:
    x = torch.randn(64, 3, 224, 224)
    ref = _reference(embedding_pt2)
    ref(x), runner(x)  # warm both paths
    held = _busy_progress(lambda: ref(x), 4)
    free = _busy_progress(lambda: runner(x), 4)
    # Holding the GIL, the busy thread only runs between forwards (a few
    # switch intervals); released, it runs through every forward.
    assert free > 5 * max(held, 1.0), (free, held)


def test_concurrent_forwards_with_several_models(embedding_pt2: Path) -> None:
    r = GilFreeRunner(embedding_pt2, num_models=2)
    try:
        inputs = [
            torch.randn(3, 3, 224, 224, generator=torch.Generator().manual_seed(i))
            for i in range(4)
        ]
        want = [r(x)[0] for x in inputs]
        got: list[torch.Tensor | None] = [None] * len(inputs)

        def work(i: int) -> None:
            got[i] = r(inputs[i])[0]

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(g is not None and torch.equal(g, w) for g, w in zip(got, want, strict=True))
    finally:
        r.close()


def _mmap_weights_package(output: Path) -> None:
    """A small linear model whose weights are appended to the ``.so`` file, not linked in.

    AOTInductor does this itself for weights too big for a data section
    (~2 GB and up, e.g. a ViT-g); ``force_mmap_weights`` makes a small
    package do the same, so the path is tested without a 2 GB export.
    """
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    program = torch.export.export(module, (torch.randn(2, 16),), strict=False)
    torch._inductor.aoti_compile_and_package(
        program,
        package_path=str(output),
        inductor_configs={"aot_inductor.force_mmap_weights": True},
    )


def test_weights_appended_to_the_library_are_read_before_it_is_removed(tmp_path: Path) -> None:
    """The runner keeps the extracted ``.so`` until the model container has read its weights."""
    from harness.packages import cached

    # The cache keys by spec name; the source dict tells this package apart.
    path = cached("h0-mini", {"module": "linear16x8", "force_mmap_weights": True},
                  _mmap_weights_package)  # fmt: skip
    x = torch.randn(2, 16)
    r = GilFreeRunner(path)
    try:
        (got,) = r(x)
        (want,) = _reference(path)(x)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    finally:
        r.close()


def _so_member(archive: zipfile.ZipFile) -> zipfile.ZipInfo:
    return next(i for i in archive.infolist() if i.filename.endswith(".wrapper.so"))


def test_a_stored_library_is_extracted_byte_for_byte(embedding_pt2: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(embedding_pt2) as archive:
        info = _so_member(archive)
        assert info.compress_type == zipfile.ZIP_STORED  # torch's packages: the fast path
        extract_member(archive, info, tmp_path / "lib.so")
        assert (tmp_path / "lib.so").read_bytes() == archive.read(info)


def test_a_corrupt_library_is_refused_by_its_crc(embedding_pt2: Path, tmp_path: Path) -> None:
    """One flipped byte inside the archive's ``.so``: the CRC-32 catches it before ``dlopen``."""
    bad = tmp_path / "bad.pt2"
    data = bytearray(embedding_pt2.read_bytes())
    with zipfile.ZipFile(embedding_pt2) as archive:
        info = _so_member(archive)
    local = data[info.header_offset : info.header_offset + 30]  # the local header
    start = info.header_offset + 30 + int.from_bytes(local[26:28], "little")
    start += int.from_bytes(local[28:30], "little")
    data[start + info.file_size // 2] ^= 1
    bad.write_bytes(bytes(data))
    with pytest.raises(zipfile.BadZipFile, match="CRC"):
        GilFreeRunner(bad)


def _rewritten(
    source: Path, target: Path, *, deflate: bool = False, drop_suffix: str | None = None
) -> Path:
    """``source``'s archive copied to ``target``: every entry deflated, or some left out."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for info in src.infolist():
            if drop_suffix and info.filename.endswith(drop_suffix):
                continue
            if deflate:
                dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
            else:
                dst.writestr(info, src.read(info))
    return target


def test_a_compressed_library_is_extracted_through_zipfile(
    embedding_pt2: Path, tmp_path: Path
) -> None:
    deflated = _rewritten(embedding_pt2, tmp_path / "deflated.pt2", deflate=True)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    r = GilFreeRunner(deflated)
    try:
        torch.testing.assert_close(r(x), _reference(embedding_pt2)(x), rtol=0, atol=0)
    finally:
        r.close()


def test_a_library_corrupted_while_extracted_is_refused_by_its_crc(
    embedding_pt2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CRC-32 is computed over the extracted file, not over the archive's bytes.

    A faulty copy cannot be produced on purpose here, so the kernel copy is
    wrapped to flip one byte of what it wrote; the archive itself is intact.
    """
    copy_range = extract._copy_range

    def faulty(src: int, dst: int, offset: int, size: int) -> None:
        copy_range(src, dst, offset, size)
        byte = os.pread(src, 1, offset + size // 2)  # dst is write-only
        os.pwrite(dst, bytes([byte[0] ^ 1]), size // 2)

    monkeypatch.setattr(extract, "_copy_range", faulty)
    with pytest.raises(zipfile.BadZipFile, match=r"Bad CRC-32 .*extracted bytes"):
        GilFreeRunner(embedding_pt2)
    monkeypatch.setattr(extract, "_copy_range", copy_range)
    GilFreeRunner(embedding_pt2).close()  # the same archive, copied right, loads


def test_a_proxy_executor_package_is_refused_at_load() -> None:
    """A real package with a custom op: it loads with torch's loader, not with this runner."""
    path = proxy_executor_package()
    with zipfile.ZipFile(path) as archive:
        assert any(n.endswith(".wrapper.json") for n in archive.namelist())
    with pytest.raises(ValueError, match=r"needs a proxy executor .*--forward_runner torch"):
        GilFreeRunner(path)
    (out,) = _reference(path)(torch.ones(2, 16))  # torch's loader serves it
    assert out.shape == (2, 8)


def test_a_package_without_input_specs_is_refused_at_load(
    embedding_pt2: Path, tmp_path: Path
) -> None:
    """No generated checks and no ``histoserve.inputs``: nothing to check inputs against."""
    bare = _rewritten(embedding_pt2, tmp_path / "bare.pt2", drop_suffix=".cpp")
    metadata = read_metadata(embedding_pt2)
    GilFreeRunner(bare).close()  # the metadata's specs serve without the source
    metadata.pop("histoserve.inputs")
    with pytest.raises(ValueError, match="records no input specs"):
        GilFreeRunner(bare, metadata=metadata)
