"""Start-up through the real path: one SHA-256 per start, phases timed and served."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from harness.packages import package_in
from predictor import startup
from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
from predictor.errors import CheckpointError
from predictor.families import model_class_for
from predictor.families.embedding import EmbeddingServerModel
from predictor.metrics import create_metrics
from predictor.package import digest
from predictor.spec import BUILTIN_SPECS

PHASES = ["digest", "metadata", "load", "probe", "warmup"]


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every path :func:`predictor.package.digest.sha256_file` hashes, in order (a spy)."""
    calls: list[Path] = []
    real = digest.sha256_file

    def spy(path: Path) -> str:
        calls.append(Path(path))
        return real(path)

    monkeypatch.setattr(digest, "sha256_file", spy)
    return calls


def _build(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> EmbeddingServerModel:
    # A private registry: the global one already holds this process's collectors.
    monkeypatch.setattr(
        startup, "create_metrics", lambda name: create_metrics(name, CollectorRegistry())
    )
    config = ModelConfig(model_dir=model_dir, device="cpu", preprocess_workers=1)
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
    assert list(phases) == PHASES
    assert all(seconds >= 0 for seconds in phases.values())
    assert phases["load"] > 0 and phases["probe"] > 0  # both run the package's code
    model.stop()


def test_a_model_built_without_a_package_loads_and_hashes_it_once(
    embedding_package_dir: Path, hashed: list[Path]
) -> None:
    spec = BUILTIN_SPECS["h0-mini"]
    path = package_in(embedding_package_dir)
    model = model_class_for(spec)(spec, path.name, device="cpu", model_root=embedding_package_dir)
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
