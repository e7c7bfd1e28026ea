"""``histoserve embed --tissue tissue-seg --slide-model abmil-demo`` against one server serving all three.

One ``python -m predictor`` with a ``--model_dir`` of three folders (``h0-mini``,
``tissue-seg``, ``abmil-demo``: the cached demo packages the separate servers
serve; the segmenter is ``test_embed``'s saturation segmenter, so the mask is
a real one) against the session's embedding and slide-head servers and a
segmentation server of its own. One slide, one run each: the one-URL run names
no ``--model``, ``--tissue-url`` nor ``--slide-url`` (the encoder is the one
model served besides the tissue model and the head). Features agree to float
rounding (each server batches the tiles its own way), everything else exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

from harness import slides
from harness.embed import read_output, run_embed
from harness.packages import copy_package_dir, demo_package, module_package
from harness.server import Server, start_server

pytestmark = pytest.mark.integration
SEGMENTER = "tests.integration.test_embed:saturation_segmenter"  # test_embed's cached package
HEAD = "abmil-demo"
RUN = ("--batch-size", "8", "--tissue", "tissue-seg", "--slide-model", HEAD)
SAME_ATTRS = ("model", "package_sha256", "spec", "tissue", "tissue_package_sha256", "config_hash")


def _segmenter() -> Path:
    return module_package("tissue-seg", SEGMENTER)


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return slides.aperio_svs(tmp_path_factory.mktemp("wsi") / "case-1.svs").path


@pytest.fixture(scope="module")
def seg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model_dir = copy_package_dir(_segmenter(), tmp_path_factory.mktemp("seg-model"))
    server = start_server(model_dir, tmp_path_factory.mktemp("seg"), "--max_batch_size", "4")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def one_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """h0-mini, tissue-seg and abmil-demo in one server, each batched as its own server is."""
    model_dir = tmp_path_factory.mktemp("models")
    folders = {
        "h0-mini": (demo_package("h0-mini"), {"max_batch_size": 8, "max_latency_ms": 20}),
        "tissue-seg": (_segmenter(), {"max_batch_size": 4}),
        HEAD: (demo_package(HEAD, max_batch=200_000), {}),  # the session head_server's export
    }
    for name, (package, settings) in folders.items():
        copy_package_dir(package, model_dir / name)
        (model_dir / name / "histoserve.json").write_text(json.dumps(settings))
    server = start_server(model_dir, tmp_path_factory.mktemp("one-log"), model_name="h0-mini")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def runs(
    slide: Path,
    one_server: Server,
    embedding_server: Server,
    seg_server: Server,
    head_server: Server,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    one, three = tmp_path_factory.mktemp("one-url"), tmp_path_factory.mktemp("three-urls")
    done = run_embed(slide, "--url", one_server.base, "--out", one, *RUN)
    assert done.returncode == 0, done.stderr + one_server.tail()
    urls = ("--tissue-url", seg_server.base, "--slide-url", head_server.base)
    done = run_embed(slide, "--url", embedding_server.base, "--out", three, *RUN, *urls)
    assert done.returncode == 0, done.stderr
    return {"one": one, "three": three}


def test_tile_features_and_coords_are_the_three_servers(runs: dict[str, Path]) -> None:
    one, three = (read_output(runs[k] / "case-1.h5") for k in ("one", "three"))
    assert len(one["coords"]) >= 4  # the segmenter found tissue: there is something to compare
    np.testing.assert_array_equal(one["coords"], three["coords"])
    np.testing.assert_array_equal(one["tissue_fraction"], three["tissue_fraction"])
    np.testing.assert_allclose(one["features"], three["features"], rtol=1e-4, atol=1e-5)
    assert {k: one["attrs"][k] for k in SAME_ATTRS} == {k: three["attrs"][k] for k in SAME_ATTRS}
    assert one["attrs"]["model"] == "h0-mini" and one["attrs"]["tissue"] == "tissue-seg"


def test_the_tissue_masks_are_the_same(runs: dict[str, Path]) -> None:
    one, three = (json.loads((runs[k] / "qc" / "case-1.geojson").read_text()) for k in runs)
    assert one["features"] and one == three


def test_the_slide_predictions_are_the_same(runs: dict[str, Path]) -> None:
    answers = {}
    for key, out in runs.items():
        with h5py.File(out / f"slide_features_{HEAD}" / "case-1.h5") as f:
            answers[key] = {name: f[name][()] for name in ("prediction", "attention")}
    for name in ("prediction", "attention"):
        np.testing.assert_allclose(answers["one"][name], answers["three"][name], rtol=1e-4)
    one, three = ((runs[k] / "slides.csv").read_text().splitlines() for k in runs)
    assert one[0] == three[0] and one[1].startswith(f"case-1,{HEAD},")
    assert len(one) == len(three) == 2
