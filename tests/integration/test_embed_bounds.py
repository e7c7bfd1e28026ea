"""``histoserve embed`` on inputs that cost more than they may: refused, or read another way.

Real parts: slides from :mod:`harness.hostile_slides` (4 x 3 JPEG tiles of
256 px, Aperio-style, 0.25 um/px: two 448 px squares read and resized to the
model's 224 px at 0.5 um/px), the session's embedding server and one started
here with a small ``--max_body_bytes`` (a real 413), the CLI in its own
interpreter. Issue 45's client cases:

- 3: a jpeg request the server refuses for its size (413) is sent again as pixels;
- 5: a one-component JPEG tile in a three-sample TIFF is a bad tile under the
  default ``--reader auto --transport auto``, as OpenSlide has it: never done;
- 6: JSON nested 1,000 deep in the folder's settings record (exit 2 naming it),
  in a ``qc/<id>.json`` (the report still written, the file named) and in a
  done file's ``slide_identity`` (the slide embedded again).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

from harness import hostile_slides
from harness.embed import by_status, read_output, run_embed, status_rows
from harness.server import Server, start_server

pytestmark = pytest.mark.integration
DEEP = "[" * 1000 + "]" * 1000
# Two model tiles as pixels are 301 KB; as JPEG tiles padded by 100 KB each, about 1 MB.
BODY_LIMIT = 500_000


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bounds-slides")
    base = hostile_slides.base_slide(root / "base.svs")
    hostile_slides.replace_tile(base, root / "grey.svs", 5, hostile_slides.one_component)
    padded = root / "padded.svs"
    shutil.copyfile(base, padded)
    for index in range(12):
        hostile_slides.replace_tile(padded, padded, index, _padded)
    return root


def _padded(tile: bytes) -> bytes:
    return hostile_slides.comment_padded(tile, 100_000)


@pytest.fixture(scope="module")
def small_body_server(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    server = start_server(
        embedding_package_dir,
        tmp_path_factory.mktemp("small-body"),
        "--max_body_bytes",
        str(BODY_LIMIT),
    )
    yield server
    server.stop()


def _embed(server: Server, out: Path, *args: str | Path, grpc: bool = False):
    url = (  # gRPC carries no mpp: the model's, as the REST config says
        ("--url", f"grpc://{server.grpc_url}", "--model", server.model_name, "--target-mpp", "0.5")
        if grpc
        else ("--url", server.base)
    )
    return run_embed(*args, *url, "--out", out, "--concurrency", "1")


@pytest.mark.parametrize("grpc", [False, True], ids=["rest", "grpc"])
def test_a_jpeg_request_refused_for_its_size_is_sent_as_pixels(
    small_body_server: Server, folder: Path, tmp_path: Path, grpc: bool
) -> None:
    """Before: the 413 failed the slide (only a 400 naming jpeg_tiles fell back); over gRPC
    the server's receive bound (RESOURCE_EXHAUSTED) was taken for a too-large answer."""
    slide = folder / "padded.svs"
    outputs = {}
    for transport in ("jpeg", "pixels"):
        out = tmp_path / transport
        result = _embed(small_body_server, out, slide, "--transport", transport, grpc=grpc)
        assert result.returncode == 0, result.stderr
        assert by_status(status_rows(out)) == {"done": ["padded"]}
        outputs[transport] = read_output(out / "padded.h5")
    assert outputs["jpeg"]["attrs"]["slide_backend"] == "native"
    assert len(outputs["jpeg"]["coords"]) == 2
    np.testing.assert_array_equal(outputs["jpeg"]["features"], outputs["pixels"]["features"])


def test_a_one_component_tile_fails_the_slide_as_openslide_would(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    """Before: read as grey, ``done``, exit 0, ``n_bad_tiles`` 0. Now as with OpenSlide:
    failed, exit 1 (its thumbnail, at the slide's only level, already reads the tile)."""
    for reader, why in (("auto", "1 component(s) where the TIFF declares 3"), ("openslide", "")):
        out = tmp_path / reader
        result = _embed(embedding_server, out, folder / "grey.svs", "--reader", reader)
        assert result.returncode == 1, result.stderr
        assert by_status(status_rows(out)) == {"failed": ["grey"]}
        error = status_rows(out)[-1]["error"]
        assert "grey.svs" in error and "Bogus JPEG colorspace" in error and why in error, error
        assert not (out / "grey.h5").exists()


def test_deep_json_in_the_settings_record_is_exit_2_naming_it(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    """Before: a RecursionError traceback, exit 1 (a Kubernetes Job retried it)."""
    tmp_path.joinpath(".histoserve-run.json").write_text(DEEP)
    result = _embed(embedding_server, tmp_path, folder / "base.svs")
    assert result.returncode == 2, result.stderr
    assert str(tmp_path / ".histoserve-run.json") in result.stderr
    assert "nested 1000 deep" in result.stderr and "Traceback" not in result.stderr


def test_deep_json_in_qc_facts_and_slide_identity_is_left_out_and_embedded_again(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    """Before: no report.html at all (qc), and the slide failed (slide_identity)."""
    first = _embed(embedding_server, tmp_path, folder / "base.svs")
    assert first.returncode == 0, first.stderr
    with h5py.File(tmp_path / "base.h5", "r+") as f:
        f.attrs["slide_identity"] = DEEP
    (tmp_path / "qc" / "other.json").write_text(DEEP)
    (tmp_path / "report.html").unlink()
    again = _embed(embedding_server, tmp_path, folder / "base.svs")
    assert again.returncode == 0, again.stderr
    assert [row["status"] for row in status_rows(tmp_path)] == ["done", "done"]
    assert "records no slide identity" in again.stderr or "embedded again" in again.stderr
    assert (tmp_path / "report.html").exists() and "Traceback" not in again.stderr
    assert "qc/other.json left out of the report" in again.stderr
    assert "nested 1000 deep" in again.stderr
