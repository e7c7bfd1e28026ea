"""``histoserve.embed`` in a notebook against a real server: the CLI's files, resume and failures.

Real parts only: a generated tiled TIFF (``harness.slides``), the demo
embedding package served on loopback, the CLI in its own interpreter beside
the API in this one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import histoserve
from harness import slides
from harness.embed import read_output, run_embed
from harness.server import Server

pytestmark = pytest.mark.integration
SAME = {"tissue": "none", "batch_size": 8, "layout": "clam", "progress": "none", "env": {}}


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small generic TIFF (0.5 um/px: 224 px tiles at the model's scale)."""
    return slides.generic_tiff(tmp_path_factory.mktemp("api-slides") / "api.tiff").path


def test_the_api_writes_what_the_cli_writes(
    embedding_server: Server, slide: Path, tmp_path: Path
) -> None:
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    flags = ("--tissue", "none", "--batch-size", "8", "--layout", "clam")
    result = run_embed(slide, "--url", embedding_server.base, "--out", cli_out, *flags)
    assert result.returncode == 0, result.stderr
    summary = histoserve.embed(slide, url=embedding_server.base, out=api_out, **SAME)
    assert (summary.done, summary.failed) == (["api"], {})
    cli, api = (read_output(out / "h5_files" / "api.h5") for out in (cli_out, api_out))
    assert len(api["features"]) > 0
    np.testing.assert_array_equal(api["coords"], cli["coords"])
    # Two runs are batched differently by the server: float rounding, never a row's worth.
    np.testing.assert_allclose(api["features"], cli["features"], rtol=1e-4, atol=1e-5)
    assert api["attrs"]["config_hash"] == cli["attrs"]["config_hash"]
    for path in (api_out / "h5_files" / "api.h5", api_out / "pt_files" / "api.pt"):
        back = histoserve.read_features(path)
        np.testing.assert_array_equal(back.features, api["features"])
        np.testing.assert_array_equal(back.coords, api["coords"])
        assert back.attrs["slide_id"] == "api"


def test_a_second_call_resumes_and_a_bad_slide_fails_alone(
    embedding_server: Server, slide: Path, tmp_path: Path
) -> None:
    out, not_a_slide = tmp_path / "out", tmp_path / "notes.tiff"
    not_a_slide.write_text("not a slide")
    first = histoserve.embed([slide, not_a_slide], url=embedding_server.base, out=out, **SAME)
    assert first.done == ["api"] and list(first.failed) == ["notes"]
    assert "notes.tiff" in first.failed["notes"]
    again = histoserve.embed(slide, url=[embedding_server.base], out=out, **SAME)
    assert (again.done, again.skipped, again.failed) == ([], ["api"], {})
