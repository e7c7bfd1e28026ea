"""A package's facts before it loads: find, verify, read metadata, host checks, batch range.

Host facts are faked with :class:`HostFacts` (the suite's only fake) to play
hosts we do not have: a GPU node, a CPU without AVX-512, another architecture.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from predictor.errors import CheckpointError, IncompatiblePackage
from predictor.packages import digest as pkg_digest
from predictor.packages import facts
from predictor.packages import host as pkg_host
from predictor.packages import metadata as pkg_meta
from predictor.packages.host import HostFacts, read_cpu_flags
from predictor.runtime import loader
from predictor.spec import BUILTIN_SPECS

CPU = torch.device("cpu")
AVX2_FLAGS = frozenset(
    {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "ssse3", "sse4_1"}
)
AVX512_FLAGS = AVX2_FLAGS | {"avx512f", "avx512dq", "avx512vl", "avx512bw"}
CPU_HOST = HostFacts("linux", "x86_64", AVX512_FLAGS)
GPU_HOST = HostFacts("linux", "x86_64", AVX512_FLAGS, cuda_capabilities=("90",))


def copy_dir(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


# -- find_candidates ----------------------------------------------------------------------
def test_find_the_only_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "model.pt2").write_bytes(b"x")
    (tmp_path / "model.pt2.sha256").write_text("0" * 64)
    (tmp_path / "genes_in.csv").write_text("gene_id\n")
    assert facts.find_candidates(tmp_path, None) == (tmp_path / "model.pt2",)


def test_several_checkpoints_are_all_candidates(tmp_path: Path) -> None:
    # Several packages used to be "exit 2 listing them"; they are now a package set,
    # from which start-up takes the one that fits (tests/unit/packages/test_package_set.py).
    for name in ("b.pt2", "a.pt2"):
        (tmp_path / name).write_bytes(b"x")
    assert facts.find_candidates(tmp_path, None) == (tmp_path / "a.pt2", tmp_path / "b.pt2")
    assert facts.find_candidates(tmp_path, "b.pt2") == (tmp_path / "b.pt2",)


@pytest.mark.parametrize(
    ("setup", "checkpoint", "needle"),
    [
        (lambda d: None, None, "no \\*.pt2 checkpoint"),
        (lambda d: (d / "a.pt2").write_bytes(b"x"), "b.pt2", "'b.pt2' not found"),
        (lambda d: None, "../etc/passwd", "must be a file name"),
        (lambda d: (d / "sub.pt2").mkdir(), None, "no \\*.pt2"),
    ],
)
def test_find_checkpoint_errors(tmp_path: Path, setup, checkpoint, needle: str) -> None:
    setup(tmp_path)
    with pytest.raises(CheckpointError, match=needle):
        facts.find_candidates(tmp_path, checkpoint)


def test_missing_model_dir(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        facts.find_candidates(tmp_path / "nope", None)


# -- sha256 -------------------------------------------------------------------------------
def test_sha256_absent_ok_and_bare_digest(tmp_path: Path) -> None:
    path = tmp_path / "m.pt2"
    path.write_bytes(b"weights" * 1000)
    assert pkg_digest.verify_sha256(path) is False
    digest = pkg_digest.sha256_file(path)
    (tmp_path / "m.pt2.sha256").write_text(f"{digest}  m.pt2\n")
    assert pkg_digest.verify_sha256(path) is True
    (tmp_path / "m.pt2.sha256").write_text(digest.upper())  # bare, any case
    assert pkg_digest.verify_sha256(path) is True


def test_sha256_mismatch_and_truncation(embedding_package_dir: Path, tmp_path: Path) -> None:
    directory = copy_dir(embedding_package_dir, tmp_path / "m")
    path = directory / "h0-mini.pt2"
    assert pkg_digest.verify_sha256(path) is True
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="tampered or truncated"):
        pkg_digest.verify_sha256(path)
    path.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(CheckpointError, match="tampered or truncated"):
        pkg_digest.verify_sha256(path)


def test_sha256_file_must_hold_a_digest(tmp_path: Path) -> None:
    path = tmp_path / "m.pt2"
    path.write_bytes(b"x")
    (tmp_path / "m.pt2.sha256").write_text("not-a-digest m.pt2\n")
    with pytest.raises(CheckpointError, match="not-a-digest"):
        pkg_digest.verify_sha256(path)


# -- read_metadata ------------------------------------------------------------------------
def test_read_metadata_matches_the_loader(embedding_package_dir: Path) -> None:
    path = embedding_package_dir / "h0-mini.pt2"
    metadata = pkg_meta.read_metadata(path)
    assert metadata == torch._C._aoti.AOTIModelPackageLoader.load_metadata_from_package(
        str(path), "model"
    )
    assert metadata == dict(loader.load_package(path, CPU).metadata)
    assert pkg_meta.embedded_spec(metadata) == BUILTIN_SPECS["h0-mini"]


def test_truncated_or_foreign_files(embedding_package_dir: Path, tmp_path: Path) -> None:
    data = (embedding_package_dir / "h0-mini.pt2").read_bytes()
    truncated = tmp_path / "t.pt2"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        pkg_meta.read_metadata(truncated)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        loader.load_package(truncated, CPU)
    text = tmp_path / "x.pt2"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        pkg_meta.read_metadata(text)
    other = tmp_path / "o.pt2"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("o/data/weights.bin", b"0")
    with pytest.raises(CheckpointError, match="aoti_compile_and_package"):
        pkg_meta.read_metadata(other)


# -- host compatibility -------------------------------------------------------------------
def test_detect_reads_this_host(tmp_path: Path) -> None:
    host = HostFacts.detect()
    assert host.machine and host.platform
    assert host.cuda_capabilities == (
        () if not torch.cuda.is_available() else host.cuda_capabilities
    )
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor : 0\nflags : fpu sse avx2 avx512f\n\nprocessor : 1\nflags : x\n")
    assert read_cpu_flags(fake) == frozenset({"fpu", "sse", "avx2", "avx512f"})
    assert read_cpu_flags(tmp_path / "missing") == frozenset()


def _meta(**values: str) -> dict[str, str]:
    base = {
        "AOTI_DEVICE_KEY": "cpu",
        "AOTI_PLATFORM": "linux",
        "AOTI_MACHINE": "x86_64",
        "AOTI_CPU_ISA": "AVX2",
    }
    return base | values


@pytest.mark.parametrize(
    ("metadata", "device", "host"),
    [
        (_meta(), CPU, CPU_HOST),
        (_meta(AOTI_CPU_ISA="AVX512"), CPU, CPU_HOST),
        (_meta(AOTI_CPU_ISA="INVALID_VEC_ISA"), CPU, HostFacts("linux", "x86_64", frozenset())),
        (
            _meta(AOTI_DEVICE_KEY="cuda", AOTI_COMPUTE_CAPABILITY="90"),
            torch.device("cuda:0"),
            GPU_HOST,
        ),
    ],
)
def test_compatible_packages_pass(metadata: dict, device: torch.device, host: HostFacts) -> None:
    pkg_host.check_host_compat(metadata, device, host)


@pytest.mark.parametrize(
    ("metadata", "device", "host", "needle"),
    [
        (_meta(AOTI_DEVICE_KEY="cuda", AOTI_COMPUTE_CAPABILITY="90"), CPU, CPU_HOST, "built for cuda"),
        (_meta(), torch.device("cuda:0"), GPU_HOST, "built for cpu"),
        (_meta(AOTI_CPU_ISA="AVX512 AVX512_VNNI"), CPU, CPU_HOST, "missing avx512_vnni"),
        (_meta(AOTI_CPU_ISA="AVX512"), CPU, HostFacts("linux", "x86_64", AVX2_FLAGS), "avx512bw"),
        (_meta(AOTI_DEVICE_KEY="cuda", AOTI_COMPUTE_CAPABILITY="90"), torch.device("cuda:0"),
         HostFacts("linux", "x86_64", AVX512_FLAGS, ("80",)), "sm_90 .* cuda:0 is sm_80"),
        (_meta(AOTI_MACHINE="aarch64"), CPU, CPU_HOST, "'aarch64'"),
        ({"AOTI_CPU_ISA": "AVX2"}, CPU, CPU_HOST, "AOTI_DEVICE_KEY"),
    ],
)  # fmt: skip
def test_incompatible_packages_are_refused(
    metadata: dict, device: torch.device, host: HostFacts, needle: str
) -> None:
    with pytest.raises((IncompatiblePackage, CheckpointError), match=needle):
        pkg_host.check_host_compat(metadata, device, host)


def test_native_build_flags_are_checked(embedding_package_dir: Path) -> None:
    metadata = pkg_meta.read_metadata(embedding_package_dir / "h0-mini.pt2")
    pkg_host.check_host_compat(metadata, CPU)  # this host built it
    required = set(json.loads(metadata[pkg_meta.CPU_BUILD_KEY])["required_flags"])
    assert "avx2" in required or "asimd" in required
    lacking = HostFacts.detect()
    lacking = dataclasses.replace(lacking, cpu_flags=lacking.cpu_flags - {sorted(required)[-1]})
    with pytest.raises(IncompatiblePackage, match=f"-march=native.*missing {sorted(required)[-1]}"):
        pkg_host.check_host_compat(metadata, CPU, lacking)


def _built_with(torch_version: str, cuda: str | None, **values: str) -> dict[str, str]:
    prov = {"torch_version": torch_version, "cuda_version": cuda, "min_batch": 1, "max_batch": 64}
    return _meta(**values) | {pkg_meta.PROVENANCE_KEY: json.dumps(prov)}


def test_a_package_exported_with_another_torch_or_cuda_is_refused_naming_both() -> None:
    cuda_meta = {"AOTI_DEVICE_KEY": "cuda", "AOTI_COMPUTE_CAPABILITY": "90"}
    gpu = dataclasses.replace(GPU_HOST, torch_version="2.13.0+cu130", cuda_version="13.0")
    pkg_host.check_host_compat(
        _built_with("2.13.0+cu130", "13.0", **cuda_meta), torch.device("cuda:0"), gpu
    )
    cases = [
        (_built_with("2.11.0+cu128", "12.8", **cuda_meta), torch.device("cuda:0"), gpu,
         "exported with torch 2.11.0[+]cu128, CUDA 12.8, sm_90 but this runtime has "
         "torch 2.13.0[+]cu130, CUDA 13.0, sm_90"),
        (_built_with("2.13.0+cu130", "12.8", **cuda_meta), torch.device("cuda:0"), gpu,
         "CUDA 12.8, sm_90 but this runtime has torch 2.13.0[+]cu130, CUDA 13.0"),
        (_built_with("2.12.0", None), CPU, dataclasses.replace(CPU_HOST, torch_version="2.13.0"),
         "exported with torch 2.12.0 [(]cpu[)] but this runtime has torch 2.13.0 [(]cpu[)]"),
    ]  # fmt: skip
    for metadata, device, host, needle in cases:
        with pytest.raises(IncompatiblePackage, match=needle) as caught:
            pkg_host.check_host_compat(metadata, device, host)
        assert "\n" not in str(caught.value)
    # A CPU package does not care which CUDA the runtime has; a vendor's records nothing.
    cpu_host = dataclasses.replace(CPU_HOST, torch_version="2.13.0+cu128", cuda_version="12.8")
    pkg_host.check_host_compat(_built_with("2.13.0+cpu", None), CPU, cpu_host)
    pkg_host.check_host_compat(_meta(), CPU, cpu_host)


def test_max_batch_size_above_the_exported_range_is_refused() -> None:
    metadata = _built_with("2.13.0", None)
    facts.check_batch_size(metadata, 64)
    with pytest.raises(IncompatiblePackage, match=r"--max_batch_size 65 is above .* \(1\.\.64\)"):
        facts.check_batch_size(metadata, 65)
    facts.check_batch_size(_meta(), 10_000)  # no recorded range: not checked
