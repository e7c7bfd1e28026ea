"""Start-up through the real path: one SHA-256 per start, phases timed and served."""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from harness.packages import package_in
from predictor import startup
from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
from predictor.errors import CheckpointError
from predictor.families import server_model
from predictor.model.base import BaseServerModel
from predictor.model.metrics import create_metrics
from predictor.packages import digest
from predictor.packages import phases as phases_module
from predictor.packages.phases import StartupPhases
from predictor.packages.probe_record import FOLDER
from predictor.spec import BUILTIN_SPECS

PHASES = ["digest", "metadata", "load", "probe", "warmup"]
GIL_FREE_PHASES = ["digest", "metadata", "extraction", *PHASES[2:]]


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every path :func:`predictor.packages.digest.sha256_file` hashes, in order (a spy)."""
    calls: list[Path] = []
    real = digest.sha256_file

    def spy(path: Path) -> str:
        calls.append(Path(path))
        return real(path)

    monkeypatch.setattr(digest, "sha256_file", spy)
    return calls


@pytest.fixture
def metadata_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every AOTInductor metadata member read through Python's zipfile, in order (a spy).

    Counts the step itself, whichever code does it (start-up's
    ``read_metadata`` or the GIL-free runner). torch's C++ loader reads its own
    copy while extracting the package; that is inside torch's one load call.
    """
    reads: list[str] = []
    real_open = zipfile.ZipFile.open  # ZipFile.read goes through open too

    def spy(self: zipfile.ZipFile, name: Any, *args: Any, **kwargs: Any) -> Any:
        member = str(getattr(name, "filename", name))
        if member.endswith("_metadata.json"):
            reads.append(member)
        return real_open(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    return reads


def _build(model_dir: Path, monkeypatch: pytest.MonkeyPatch, **options: Any) -> BaseServerModel:
    # A private registry: the global one already holds this process's collectors.
    monkeypatch.setattr(
        startup, "create_metrics", lambda name: create_metrics(name, CollectorRegistry())
    )
    # The load probe runs under --load_probe auto for a package this host has not loaded:
    # off here unless asked (its own tests below give it a record of its own).
    fields = {"device": "cpu", "preprocess_workers": 1, "load_probe": "off", **options}
    config = ModelConfig(model_dir=model_dir, **fields)
    return startup.build_model(config, BatchingConfig(), LimitsConfig())


def test_build_model_hashes_the_package_once(
    embedding_package_dir: Path, hashed: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (embedding_package_dir / "h0-mini.pt2.sha256").is_file()  # else nothing to hash
    model = _build(embedding_package_dir, monkeypatch)
    assert hashed == [embedding_package_dir / "h0-mini.pt2"]
    assert model.load() and hashed == [embedding_package_dir / "h0-mini.pt2"]  # KServe reloads
    model.stop()


def test_the_digest_is_served_with_or_without_a_digest_file(
    embedding_package_dir: Path, tmp_path: Path, hashed: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients record which package made their outputs: the one hash is reported."""
    bare = tmp_path / "bare"
    bare.mkdir()
    source = package_in(embedding_package_dir)
    (bare / source.name).write_bytes(source.read_bytes())
    expected = (embedding_package_dir / "h0-mini.pt2.sha256").read_text().split()[0]
    for model_dir in (embedding_package_dir, bare):
        model = _build(model_dir, monkeypatch)
        assert model.get_metadata()["package_sha256"] == expected
        model.stop()
    assert hashed == [source, bare / source.name]  # once per start, sidecar or not


def test_startup_phases_are_timed_and_served(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _build(embedding_package_dir, monkeypatch)
    phases = model.get_metadata()["startup_seconds"]
    assert list(phases) == GIL_FREE_PHASES  # --forward_runner auto on the CPU
    assert all(seconds >= 0 for seconds in phases.values())
    assert phases["load"] > 0 and phases["probe"] > 0  # both run the package's code
    model.stop()


def test_a_model_built_without_a_package_loads_and_hashes_it_once(
    embedding_package_dir: Path, hashed: list[Path]
) -> None:
    spec = BUILTIN_SPECS["h0-mini"]
    path = package_in(embedding_package_dir)
    model = server_model(spec, path.name, device="cpu", model_root=embedding_package_dir)
    assert model.load() and hashed == [path]
    assert list(model.get_metadata()["startup_seconds"]) == PHASES
    model.stop()


def test_a_tampered_package_stops_start_up_before_loading(
    embedding_package_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "m"
    copy.mkdir()
    for item in embedding_package_dir.iterdir():
        (copy / item.name).write_bytes(item.read_bytes())
    (copy / "h0-mini.pt2.sha256").write_text("0" * 64 + "  h0-mini.pt2\n")
    with pytest.raises(CheckpointError, match="tampered or truncated"):
        _build(copy, monkeypatch)


@pytest.mark.parametrize(
    ("options", "phases"),
    [
        ({}, GIL_FREE_PHASES),  # --forward_runner auto: the GIL-free runner on the CPU
        ({"device": "auto"}, GIL_FREE_PHASES),  # every visible device: here the CPU
        ({"forward_runner": "gil_free"}, GIL_FREE_PHASES),
        ({"forward_runner": "torch"}, PHASES),
        # the load probe's child hashes nothing and reads the metadata in its own process
        ({"load_probe": "on"}, [*GIL_FREE_PHASES[:2], "load_probe", *GIL_FREE_PHASES[2:]]),
    ],
    ids=["cpu", "device-auto", "gil-free", "torch", "load-probe"],
)
def test_no_start_up_step_runs_twice(
    embedding_package_dir: Path,
    hashed: list[Path],
    metadata_reads: list[str],
    monkeypatch: pytest.MonkeyPatch,
    options: dict[str, str],
    phases: list[str],
) -> None:
    """One hash and one metadata read per start, on every path and across KServe's reloads."""
    model = _build(embedding_package_dir, monkeypatch, **options)
    assert hashed == [embedding_package_dir / "h0-mini.pt2"]
    assert len(metadata_reads) == 1, metadata_reads
    assert model.load() and model.load()  # KServe calls load again: nothing re-runs
    assert len(hashed) == 1 and len(metadata_reads) == 1
    assert list(model.get_metadata()["startup_seconds"]) == phases
    model.stop()


def test_auto_probes_a_package_once_per_host_and_again_after_a_load_that_died(
    embedding_package_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The default: the first start of a package on a host probes it, the restart does not;
    a load that died in the server (its marker left behind) makes the next start probe again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    caplog.set_level(logging.INFO, logger="histoserve")
    first = _build(embedding_package_dir, monkeypatch, load_probe="auto")
    assert "load_probe" in first.get_metadata()["startup_seconds"]
    first.stop()
    again = _build(embedding_package_dir, monkeypatch, load_probe="auto")
    assert "load_probe" not in again.get_metadata()["startup_seconds"]
    assert "load probe: h0-mini.pt2 was loaded on this host before; not probed" in caplog.text
    again.stop()
    (record,) = [p for p in (tmp_path / FOLDER).iterdir() if not p.name.startswith(".")]
    (record.parent / (record.name + ".loading")).touch()  # a server died while loading it
    third = _build(embedding_package_dir, monkeypatch, load_probe="auto")
    assert "load_probe" in third.get_metadata()["startup_seconds"]
    assert "did not finish (it died while loading); probing it again" in caplog.text
    third.stop()


class FakeClock:
    """``time.monotonic`` that moves only when the test says: durations exact, no sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_nested_phases_are_exclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Extraction timed inside load counts once: the phases add up to the time they cover."""
    clock = FakeClock()
    monkeypatch.setattr(phases_module, "time", clock)  # the phases' clock only, not the process's
    phases = StartupPhases()
    start = clock.monotonic()
    with phases.time("load"):
        clock.now += 0.125
        with phases.time("extraction"):
            clock.now += 0.5
        clock.now += 0.25
    covered = clock.monotonic() - start
    seconds = phases.as_dict()
    assert list(seconds) == ["extraction", "load"]
    assert seconds == {"extraction": 0.5, "load": 0.375}
    assert sum(seconds.values()) == covered


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["--max_batch_size", "300"],
            r"--max_batch_size 300 is above the batch range the package was exported for \(1\.\.256\)",
        ),
        (["--forward_runner", "torch"], "exported with torch .* but this runtime has torch 2.99.0"),
    ],
)
def test_start_up_refuses_what_the_package_was_not_built_for(
    embedding_package_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    needle: str,
) -> None:
    """Exit 2 and one line, before anything is loaded: a batch range, another torch."""
    import re

    import torch

    from predictor import cli

    if "torch" in argv:
        monkeypatch.setattr(torch, "__version__", "2.99.0")  # this runtime, as another torch
    base = ["--model_dir", str(embedding_package_dir), "--device", "cpu", "--http_port", "0"]
    assert cli.serve([*base, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(needle, err[0]), err


def test_tf32_is_for_fp32_packages_on_cuda_when_asked() -> None:
    """Only a GPU runs TF32; here the flags torch reads are checked, then restored."""
    import torch

    from predictor.cli import build_parser, configs_from_args
    from predictor.runtime.devices import apply_gpu_settings

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32
    try:
        matmul.allow_tf32 = cudnn.allow_tf32 = False
        cuda = torch.device("cuda", 0)
        assert not apply_gpu_settings(torch.device("cpu"), torch.float32, allow_tf32=True)
        assert not apply_gpu_settings(cuda, torch.bfloat16, allow_tf32=True)
        assert not apply_gpu_settings(cuda, torch.float32, allow_tf32=False)
        assert not matmul.allow_tf32 and not cudnn.allow_tf32
        assert apply_gpu_settings(cuda, torch.float32, allow_tf32=True)
        assert matmul.allow_tf32 and cudnn.allow_tf32
        cudnn.allow_tf32 = True  # torch's own default: --allow_tf32 false switches it off
        assert not apply_gpu_settings(cuda, torch.float32, allow_tf32=False)
        assert not matmul.allow_tf32 and not cudnn.allow_tf32
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved
    assert configs_from_args(build_parser().parse_args(["--allow_tf32", "true"]))[0].allow_tf32
    assert not configs_from_args(build_parser().parse_args([]))[0].allow_tf32


class _Repository:
    """Stands in for :class:`~predictor.repository.repository.Repository`: keeps the model factory."""

    budget_bytes = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.build = args[4]

    def load_at_start(self) -> list[BaseServerModel]:
        return []


@pytest.mark.parametrize(("switch", "shared"), [(None, True), ("0", True), ("1", False)])
def test_a_repositorys_models_share_one_scheduler_unless_the_bench_switch_is_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, switch: str | None, shared: bool
) -> None:
    """``HISTOSERVE_BENCH_NO_SCHEDULER=1`` (``bench.studies.fairness``' "without" arm) and
    only it builds every model of the repository without the shared device scheduler."""
    if switch is None:
        monkeypatch.delenv(startup.NO_SCHEDULER_ENV, raising=False)
    else:
        monkeypatch.setenv(startup.NO_SCHEDULER_ENV, switch)
    monkeypatch.setattr(startup, "Repository", _Repository)
    monkeypatch.setattr(startup, "memory_budget_gauge", lambda budget_bytes: None)
    configs = (
        ModelConfig(model_dir=str(tmp_path), device="cpu"),
        BatchingConfig(),
        LimitsConfig(),
    )
    repository, _ = startup.build_repository({}, configs, startup.RepositoryConfig(), 5.0)
    scheduler = repository.build.keywords["scheduler"]
    assert isinstance(scheduler, startup.DeviceScheduler) is shared
    assert shared or scheduler is None
