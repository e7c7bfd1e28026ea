"""Reliability fixtures: live servers with tight limits, a pool of known tiles, bounded load.

Every load loop is bounded twice, in requests and in seconds, and talks to
127.0.0.1 only. Figures (requests sent, lost, mixed up, RSS growth, drain
time, latencies) go to ``.cache/reliability/<suite>.json`` (or
``$HISTOSERVE_RELIABILITY_DIR``) for docs/reliability.md's table; a ``_long`` suffix
marks the ``slow`` variants.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.packages import package_in
from harness.reference import Reference
from harness.server import Server
from tests.reliability.load import CLIENTS, LIMITED_FLAGS, TILES_PER_CLIENT, running
from tests.reliability.traffic import TilePool


@pytest.fixture(scope="package")
def limited_server(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """``h0-mini`` with tight limits, shared by the bad-input, mixed-load and short soak runs."""
    with running(embedding_package_dir, tmp_path_factory.mktemp("limited"), *LIMITED_FLAGS) as s:
        yield s


@pytest.fixture(scope="package")
def multimodal_server(
    multimodal_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """``m-optimus`` (takes bulk RNA) with the same limits."""
    with running(multimodal_package_dir, tmp_path_factory.mktemp("mm"), *LIMITED_FLAGS) as s:
        yield s


@pytest.fixture(scope="package")
def reference(embedding_package_dir: Path) -> Reference:
    """The embedding package run in this process: numerical truth."""
    return Reference(package_in(embedding_package_dir))


@pytest.fixture(scope="package")
def tile_pool(reference: Reference) -> TilePool:
    """``CLIENTS x TILES_PER_CLIENT`` tiles whose embeddings are pairwise far apart."""
    pool = TilePool(reference, CLIENTS, TILES_PER_CLIENT)
    assert pool.min_distance > 100 * 1e-4, "pool tiles are not distinguishable"
    return pool
