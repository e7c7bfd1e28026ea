"""``histoserve aggregate`` against the real server serving the ``abmil-demo`` slide head.

Skipped where the server side of issue 25 (the ``slide`` family, built beside this client)
is not there yet. Real everything: the exported demo package, ``python -m predictor``, V2
binary REST and gRPC, the client in its own interpreter without torch or kserve.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from harness.embed import run_aggregate
from harness.server import Server
from predictor.spec import BUILTIN_SPECS
from tests.unit.histoserve.heads import features as ff

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif("abmil-demo" not in BUILTIN_SPECS, reason="no slide family here yet"),
]
D = 1536
SIZES = (1, 7, 156)  # N = 1, 7 and a slide's worth


def _aggregate(folder: Path, *urls: str) -> subprocess.CompletedProcess:
    args = [str(folder), "--model", "abmil-demo", *(w for u in urls for w in ("--url", u))]
    return run_aggregate(*args)


def _folder(layout: str, root: Path) -> Path:
    out = root / layout
    for i, n in enumerate(SIZES):
        coords = ff.tissue_coords(n)
        features = np.random.default_rng(i).standard_normal((len(coords), D)).astype(np.float32)
        ff.write(layout, out, f"S{i}", features, coords)
    return out


def test_every_layout_and_transport_gives_one_answer_per_slide(
    head_server: Server, tmp_path: Path
) -> None:
    answers: dict[str, list[dict[str, np.ndarray]]] = {}
    for layout, urls in (
        ("flat", (head_server.base,)),
        ("trident", (head_server.base,)),
        ("clam", (head_server.base, f"grpc://{head_server.grpc_url}")),
    ):
        folder = _folder(layout, tmp_path)
        run = _aggregate(folder, *urls)
        assert run.returncode == 0, run.stderr + head_server.tail()
        for path in sorted(folder.rglob("slide_features_abmil-demo/*.h5")):
            with h5py.File(path) as f:
                answers.setdefault(path.stem, []).append({k: f[k][()] for k in f})
    assert sorted(answers) == ["S0", "S1", "S2"]
    for slide_id, (first, *others) in answers.items():
        n = SIZES[int(slide_id[1])]
        assert first["attention"].shape == (n,) and first["prediction"].shape == (2,)
        assert float(first["attention"].sum()) == pytest.approx(1.0, abs=1e-5)
        assert first["features"].shape == (512,)
        for other in others:
            for name in ("prediction", "attention", "features"):
                np.testing.assert_allclose(other[name], first[name], rtol=1e-5, atol=1e-6)


def test_features_of_another_width_fail_their_slide_only(
    head_server: Server, tmp_path: Path
) -> None:
    folder = _folder("flat", tmp_path)
    coords = ff.tissue_coords(5)
    ff.write("flat", folder, "narrow", np.ones((len(coords), 768), np.float32), coords)
    run = _aggregate(folder, head_server.base)
    assert run.returncode == 1
    assert "3 done" in run.stderr and "1 failed" in run.stderr
    assert "narrow.h5: features are 768 wide but 'abmil-demo' takes 1536" in run.stderr


def test_a_slide_the_head_overflows_on_fails_once_never_retried(
    head_server: Server, tmp_path: Path
) -> None:
    """Issue 33, case 11: a 200 with NaN used to be retried eight times, then fail."""
    folder = _folder("flat", tmp_path)
    coords = ff.tissue_coords(6)
    huge = np.random.default_rng(5).standard_normal((len(coords), D)).astype(np.float32)
    huge[1] = 3e38
    ff.write("flat", folder, "huge", huge, coords)
    start = len(head_server.log())
    run = _aggregate(folder, head_server.base)
    assert run.returncode == 1 and "3 done" in run.stderr and "1 failed" in run.stderr
    assert "HTTP 422" in run.stderr and "output 'prediction' is not finite" in run.stderr
    during = head_server.log()[start:]  # what the server logged while this run went
    assert during.count('/infer HTTP/1.1" 422') == 1  # one attempt, not eight


def test_embed_with_a_slide_model_gives_features_table_heatmap_geojson_and_report(
    head_server: Server, embedding_server: Server, tmp_path: Path
) -> None:
    """The issue's "done when": one command, tile features and the slide model's outputs."""
    from harness import slides
    from harness.embed import run_embed

    slide = slides.aperio_svs(tmp_path / "wsi" / "case-1.svs").path
    out = tmp_path / "features"
    run = run_embed(
        slide, "--url", embedding_server.base, "--out", out, "--slide-model", "abmil-demo",
        "--slide-url", head_server.base, "--batch-size", "8",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr + head_server.tail()
    with h5py.File(out / "case-1.h5") as f:
        n = len(f["features"])
    with h5py.File(out / "slide_features_abmil-demo" / "case-1.h5") as f:
        assert f["attention"].shape == (n,) and f["prediction"].shape == (2,)
    table = (out / "slides.csv").read_text().splitlines()
    assert table[0].endswith("class_0,class_1") and table[1].startswith("case-1,abmil-demo,")
    for name in ("heatmap.jpg", "geojson", "top.jpg"):
        assert (out / "qc" / f"case-1.abmil-demo.{name}").stat().st_size > 1000
    assert "qc/case-1.abmil-demo.heatmap.jpg" in (out / "report.html").read_text()
