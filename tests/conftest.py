"""Session fixtures: real demo ``.pt2`` packages, a live embedding server and a live slide head.

Packages come from the on-disk cache in :mod:`harness.packages` (compiled once,
shared across sessions and with the benchmark). Every ``*_package_dir``
fixture is a per-session copy holding exactly one ``<spec>.pt2`` + its
``.sha256`` (+ gene CSVs for multimodal), so tests may corrupt their copy
without touching the cache. Plain helpers (server subprocesses, tiles, the
in-process reference) live in :mod:`harness`, not here: test modules import
them from there, never from a conftest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.packages import copy_package_dir, demo_package
from harness.server import Server, start_server


def _session_dir(tmp_path_factory: pytest.TempPathFactory, name: str, package: Path) -> Path:
    return copy_package_dir(package, tmp_path_factory.mktemp(name))


@pytest.fixture(scope="session")
def embedding_package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``h0-mini.pt2`` (tiny demo ViT, embedding 1536) + ``.sha256``."""
    return _session_dir(tmp_path_factory, "embedding-package", demo_package("h0-mini"))


@pytest.fixture(scope="session")
def multimodal_package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``m-optimus.pt2`` (G=64 in, K=32 out) + ``.sha256`` + ``genes_in.csv``/``genes_out.csv``."""
    return _session_dir(tmp_path_factory, "multimodal-package", demo_package("m-optimus"))


@pytest.fixture(scope="session")
def segmentation_package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tissue-seg.pt2`` (logits ``[B, 1, 512, 512]``) + ``.sha256``."""
    return _session_dir(tmp_path_factory, "segmentation-package", demo_package("tissue-seg"))


@pytest.fixture(scope="session")
def padded_segmentation_package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tissue-seg.pt2`` whose output batch axis is padded to 8 (batches up to 8)."""
    package = demo_package("tissue-seg", pad_to_batch=8)
    return _session_dir(tmp_path_factory, "padded-segmentation-package", package)


@pytest.fixture(scope="session")
def demo_package_factory() -> Callable[..., Path]:
    """:func:`harness.packages.demo_package` as a fixture, for tests that need other options."""
    return demo_package


@pytest.fixture(scope="session")
def embedding_server(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The real ``python -m predictor`` serving the embedding package (batches of 8).

    One for the whole session: the tests that take it only send requests. A test
    that changes a server (faults, drains, restarts) starts its own.
    """
    server = start_server(
        embedding_package_dir,
        tmp_path_factory.mktemp("emb"),
        "--max_batch_size",
        "8",
        "--max_latency_ms",
        "20",
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def head_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The real ``python -m predictor`` serving the ``abmil-demo`` slide head (200,000 tiles a slide).

    One for the whole session: the tests that take it only send requests.
    """
    package = demo_package("abmil-demo", max_batch=200_000)  # test_slide_server's export
    model_dir = _session_dir(tmp_path_factory, "abmil", package)
    server = start_server(
        model_dir, tmp_path_factory.mktemp("abmil-log"), "--model_name", "abmil-demo"
    )
    yield server
    server.stop()
