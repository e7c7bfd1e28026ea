"""The load probe in-process: when it runs, how it describes a build, its steps, and a child's error.

The crash and hang cases, through ``python -m predictor``, are in
``tests/integration/test_load_probe.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.packages import demo_package, package_in
from predictor.errors import CheckpointError
from predictor.packages.metadata import read_metadata
from predictor.runtime.load_probe import (
    _Context,
    _failure_message,
    _Outcome,
    describe_build,
    probe_load,
    probe_wanted,
)

# The metadata a CUDA package records (none can be exported here: no GPU).
CUDA_METADATA = {
    "AOTI_DEVICE_KEY": "cuda",
    "AOTI_COMPUTE_CAPABILITY": "90",
    "histoserve.provenance": json.dumps(
        {"torch_version": "2.11.0+cu130", "cuda_version": "13.0", "dtype": "bf16",
         "source": "demo:vit-b", "device": "cuda"}
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("setting", "cuda", "cpu_new", "cpu_known"),
    [("auto", True, True, False), ("on", True, True, True), ("off", False, False, False)],
)
def test_auto_probes_cuda_packages_and_packages_this_host_has_not_loaded(
    setting: str, cuda: bool, cpu_new: bool, cpu_known: bool
) -> None:
    assert probe_wanted(setting, CUDA_METADATA, loaded_before=True) is cuda
    cpu = {"AOTI_DEVICE_KEY": "cpu"}
    assert probe_wanted(setting, cpu, loaded_before=False) is cpu_new
    assert probe_wanted(setting, cpu, loaded_before=True) is cpu_known


def test_the_build_is_named_from_the_metadata(embedding_package_dir: Path) -> None:
    assert describe_build(CUDA_METADATA) == (
        "cuda package, torch 2.11.0+cu130, CUDA 13.0, sm_90, bf16, from demo:vit-b"
    )
    cpu = describe_build(read_metadata(package_in(embedding_package_dir)))
    assert cpu.startswith("cpu package, torch 2.") and "-march=native (" in cpu
    assert cpu.endswith("fp32, from demo:tiny")
    assert (
        describe_build({})
        == "unknown device package, torch unknown, -march=unknown (no vector ISA recorded)"
    )


def test_a_good_package_reports_each_step_in_order(embedding_package_dir: Path) -> None:
    path = package_in(embedding_package_dir)
    report = probe_load(path, "cpu", read_metadata(path), timeout_s=120)
    names = [name for name, _ in report.steps]
    assert names[:3] == ["import_torch", "read_metadata", "load"] and names[-1] == "forward"
    assert "extraction" in names  # the GIL-free runner's own phase, inside load
    starts = [at for _, at in report.steps]
    assert starts == sorted(starts) and 0 < starts[-1] <= report.seconds
    torch_runner = probe_load(path, "cpu", read_metadata(path), runner="torch", timeout_s=120)
    assert [n for n, _ in torch_runner.steps] == [
        "import_torch",
        "read_metadata",
        "load",
        "forward",
    ]


def test_a_python_error_in_the_child_is_its_message(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.pt2"
    bogus.write_bytes(b"not a zip")
    with pytest.raises(CheckpointError) as caught:
        probe_load(bogus, "cpu", {}, timeout_s=120)
    message = str(caught.value)
    assert "failed (exit 3): CheckpointError:" in message and "not a readable .pt2" in message
    assert "during step 'read_metadata'" in message and str(bogus) in message


@pytest.mark.parametrize(
    ("layout", "cuda", "step", "hinted"),
    [
        ("auto", True, "load", True),  # embedded weights, read from the library itself
        ("auto", True, "forward", False),  # loaded: not the upload
        ("mmap", True, "load", False),  # already mapped
        ("auto", False, "load", False),  # a CPU package
    ],
)
def test_a_cuda_load_crash_names_the_other_weights_layout(
    layout: str, cuda: bool, step: str, hinted: bool
) -> None:
    """The packages are real CPU demo packages; the CUDA key is what a GPU export would record."""
    path = demo_package("h0-mini", **({"weights_layout": "mmap"} if layout == "mmap" else {}))
    metadata = {"AOTI_DEVICE_KEY": "cuda" if cuda else "cpu"}  # no recorded layout: older builds
    outcome = _Outcome(lines=[], returncode=-11, timed_out=False, tail="", seconds=3.0)
    context = _Context("start-up", "--load_timeout_s", 300.0, None)
    steps = (("import_torch", 0.0), (step, 2.0))
    message = _failure_message(path, metadata, outcome, steps, context)
    assert "killed by signal SIGSEGV" in message and f"during step '{step}'" in message
    assert ("export with `--weights_layout mmap`" in message) is hinted
