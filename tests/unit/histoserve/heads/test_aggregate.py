"""``histoserve aggregate`` over feature files of every layout, against a loopback slide head.

The head is :class:`harness.slide_server.SlideServer`, a FAKE (numpy ABMIL on
a real socket with real V2 binary bodies): the server side of issue 25 is
built elsewhere at the same time; its contract is what the fake serves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from harness.slide_server import CLASSES, DIGEST, SlideServer
from histoserve.commands.aggregate import main
from histoserve.heads.aggregate import AggregateConfig, aggregate
from histoserve.heads.pictures import picture_files
from histoserve.heads.table import read_table
from histoserve.results.sources import find_sources
from tests.unit.histoserve.heads import features as ff

REPO = Path(__file__).resolve().parents[4]
LAYOUTS = ("flat", "trident", "clam")


@pytest.fixture(scope="module")
def server():
    with SlideServer("abmil-demo", ff.D) as s:
        yield s


def _cohort(layout: str, out: Path, n_slides: int = 3) -> dict[str, np.ndarray]:
    """Writes ``n_slides`` slides of features; returns features by slide id."""
    made = {}
    for i in range(n_slides):
        coords = ff.tissue_coords(40 + 30 * i)
        features = ff.features_for(coords, seed=i)
        ff.write(layout, out, f"S{i}", features, coords)
        made[f"S{i}"] = features
    return made


def _config(out: Path, server: SlideServer, **kw) -> AggregateConfig:
    return AggregateConfig(out, (server.url,), "abmil-demo", max_attempts=2, **kw)


def _result(out: Path, layout: str, slide_id: str) -> Path:
    root = next(iter({s.root for s in find_sources(out)}))
    assert root == (out if layout != "trident" else out / "10x_224px_0px_overlap")
    return root / "slide_features_abmil-demo" / f"{slide_id}.h5"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gives_the_heads_numbers_beside_the_features(
    tmp_path: Path, server: SlideServer, layout: str
) -> None:
    made = _cohort(layout, tmp_path)
    summary = aggregate(_config(tmp_path, server))
    assert sorted(summary.done) == sorted(made) and not summary.failed
    for slide_id, features in made.items():
        want = server.expected(features)
        with h5py.File(_result(tmp_path, layout, slide_id)) as f:
            np.testing.assert_allclose(f["prediction"][()], want["prediction"], rtol=1e-6)
            np.testing.assert_allclose(f["attention"][()], want["attention"], rtol=1e-6)
            np.testing.assert_allclose(f["features"][()], want["slide_embedding"], rtol=1e-6)
            assert f["attention"].shape == (len(features),)
            assert f.attrs["package_sha256"] == DIGEST and f.attrs["complete"]
            assert json.loads(f.attrs["classes"]) == list(CLASSES)
        tiling = "10x_224px_0px_overlap" if layout == "trident" else ""
        pictures = picture_files(tmp_path, slide_id, "abmil-demo", tiling)
        assert pictures.heatmap.stat().st_size > 10_000
        assert not pictures.top.exists()  # no slide
    rows = read_table(tmp_path)
    assert [r["slide_id"] for r in rows] == sorted(made)
    row = rows[0]
    assert row["model"] == "abmil-demo" and row["package_sha256"] == DIGEST
    want = server.expected(made["S0"])["prediction"]
    assert [float(row[c]) for c in CLASSES] == pytest.approx(want.tolist(), rel=1e-5)
    sent = server.seen[-1]
    assert sent["inputs"] == {"features": "float32", "coords": "int64"}
    assert sent["params"].get("mode") == "prediction,embedding,attention"


def test_resume_skips_done_slides_and_reruns_changed_features(
    tmp_path: Path, server: SlideServer
) -> None:
    made = _cohort("flat", tmp_path, 2)
    aggregate(_config(tmp_path, server))
    again = aggregate(_config(tmp_path, server))
    assert sorted(again.skipped) == sorted(made) and not again.done
    coords = ff.tissue_coords(40)
    ff.write("flat", tmp_path, "S0", ff.features_for(coords, seed=9), coords)  # re-embedded
    third = aggregate(_config(tmp_path, server))
    assert third.done == ["S0"] and third.skipped == ["S1"]
    assert sorted(aggregate(_config(tmp_path, server, force=True)).done) == ["S0", "S1"]


def test_shards_are_disjoint_and_cover_the_folder(tmp_path: Path, server: SlideServer) -> None:
    made = _cohort("flat", tmp_path, 5)
    done = [aggregate(_config(tmp_path, server, shard=(i, 2))).done for i in range(2)]
    assert not set(done[0]) & set(done[1]) and sorted(done[0] + done[1]) == sorted(made)
    assert len(read_table(tmp_path)) == 5  # the last shard's table covers every slide


def test_slides_csv_has_rows_only_for_results_made_from_the_features_as_they_are(
    tmp_path: Path, server: SlideServer
) -> None:
    """Issue 33, case 2: a deleted or replaced features file takes its numbers with it."""
    _cohort("flat", tmp_path, 3)
    aggregate(_config(tmp_path, server))
    assert [r["slide_id"] for r in read_table(tmp_path)] == ["S0", "S1", "S2"]
    (tmp_path / "S1.h5").unlink()  # the features are gone
    coords = ff.tissue_coords(40)
    nan = ff.features_for(coords, seed=5)
    nan[0, 0] = np.nan
    ff.write("flat", tmp_path, "S2", nan, coords)  # replaced by one that now fails
    summary = aggregate(_config(tmp_path, server))
    assert summary.skipped == ["S0"] and list(summary.failed) == ["S2"]
    assert [r["slide_id"] for r in read_table(tmp_path)] == ["S0"]


def test_the_record_of_the_features_is_of_the_bytes_the_head_answered(
    tmp_path: Path, server: SlideServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33, case 4: features renamed over the file while the head answers are not 'done'."""
    from histoserve.remote.dispatch import Dispatcher

    _cohort("flat", tmp_path, 1)
    other = tmp_path / "elsewhere"
    coords = ff.tissue_coords(70)
    ff.write("flat", other, "S0", ff.features_for(coords, seed=7), coords)
    send = Dispatcher.send

    def renamed_meanwhile(self, request, *args, **kwargs):
        if request.kind == "infer":  # while the head answers, not while it is described
            os.replace(other / "S0.h5", tmp_path / "S0.h5")
        return send(self, request, *args, **kwargs)

    monkeypatch.setattr(Dispatcher, "send", renamed_meanwhile)
    assert aggregate(_config(tmp_path, server)).done == ["S0"]
    monkeypatch.undo()
    assert read_table(tmp_path) == []  # the answer is of the old features: not today's row
    again = aggregate(_config(tmp_path, server))
    assert again.done == ["S0"]  # resume runs the new features, never skips them for good
    with h5py.File(_result(tmp_path, "flat", "S0")) as f:
        assert f["attention"].shape == (70,)
    assert [r["slide_id"] for r in read_table(tmp_path)] == ["S0"]


def test_features_under_another_name_or_from_another_encoder_fail_naming_both(
    tmp_path: Path, server: SlideServer
) -> None:
    """Issue 33, case 5: cp S1.h5 S9.h5 gave S9 S1's prediction; another encoder's passed."""
    import shutil

    _cohort("flat", tmp_path, 2)
    shutil.copy(tmp_path / "S1.h5", tmp_path / "S9.h5")
    coords = ff.tissue_coords(40)
    ff.write("flat", tmp_path, "S7", ff.features_for(coords), coords)
    with h5py.File(tmp_path / "S7.h5", "r+") as f:  # as embed writes it, behind another encoder
        f.attrs["spec"] = json.dumps({"name": "h-optimus-0", "family": "embedding"})
    summary = aggregate(_config(tmp_path, server))
    assert sorted(summary.done) == ["S0", "S1"]
    assert "features of slide 'S1', not of 'S9'" in summary.failed["S9"]
    assert "tile encoder 'h-optimus-0'" in summary.failed["S7"]
    assert "of 'h0-mini'" in summary.failed["S7"]
    assert [r["slide_id"] for r in read_table(tmp_path)] == ["S0", "S1"]


def _bad_files(out: Path) -> dict[str, str]:
    """Bad feature files beside good ones: slide id -> what its failure must say."""
    coords = ff.tissue_coords(30)
    nan = ff.features_for(coords)
    nan[3, 2] = np.nan
    ff.write("flat", out, "nan", nan, coords)
    ff.write("flat", out, "wide", np.ones((30, ff.D + 1), np.float32), coords)
    ff.write("flat", out, "empty", np.zeros((0, ff.D), np.float32), coords[:0])
    (out / "garbage.h5").write_bytes(b"not hdf5 at all")
    with h5py.File(out / "nofeatures.h5", "w") as f:
        f["coords"] = coords
    return {
        "nan": "non-finite", "wide": f"{ff.D + 1} wide but 'abmil-demo' takes {ff.D}",
        "empty": "no tiles", "garbage": "not a readable HDF5", "nofeatures": "no 'features'",
    }  # fmt: skip


def test_every_bad_file_fails_its_slide_alone_naming_file_and_reason(
    tmp_path: Path, server: SlideServer, capsys: pytest.CaptureFixture
) -> None:
    _cohort("flat", tmp_path, 2)
    expected = _bad_files(tmp_path)
    code = main([str(tmp_path), "--url", server.url, "--model", "abmil-demo"])
    assert code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "2 done" in err and f"{len(expected)} failed" in err
    lines = (tmp_path / "slides_status.csv").read_text().splitlines()
    for slide_id, reason in expected.items():
        line = next(x for x in lines if x.startswith(f"{slide_id},"))
        assert ",failed," in line and reason in line and f"{slide_id}.h5" in line, line
    assert len(read_table(tmp_path)) == 2


@pytest.mark.parametrize("tamper", ["short", "nan", "rename", "dtype", "400"])
def test_a_wrong_answer_is_never_written(tmp_path: Path, tamper: str) -> None:
    _cohort("flat", tmp_path, 1)
    with SlideServer("abmil-demo", ff.D, tamper=tamper) as bad:
        summary = aggregate(_config(tmp_path, bad))
    reason = summary.failed["S0"]
    assert "S0.h5" in reason
    assert ("refused" in reason) if tamper == "400" else ("a wrong answer" in reason), reason
    assert not (tmp_path / "slide_features_abmil-demo" / "S0.h5").exists()


def test_attention_per_class_is_written_and_checked(tmp_path: Path) -> None:
    made = _cohort("trident", tmp_path, 1)
    with SlideServer("abmil-demo", ff.D, branches=True) as s:
        assert aggregate(_config(tmp_path, s)).done == ["S0"]
        want = s.expected(made["S0"])
    with h5py.File(_result(tmp_path, "trident", "S0")) as f:
        assert f["attention"].shape == (len(made["S0"]), len(CLASSES))
        np.testing.assert_allclose(f["attention"][()], want["attention"], rtol=1e-6)


def test_the_head_s_limits_and_encoder_are_checked_before_sending(tmp_path: Path) -> None:
    made = _cohort("flat", tmp_path, 2)  # 40 and 70 tiles, made by package "h0-mini"
    with SlideServer("abmil-demo", ff.D, max_tiles=50) as s:
        summary = aggregate(_config(tmp_path, s))
        assert summary.done == ["S0"] and "70 tiles, more than the 50" in summary.failed["S1"]
        assert [seen["n"] for seen in s.seen] == [len(made["S0"])]
    with h5py.File(tmp_path / "S0.h5", "a") as f:
        f.attrs["package_sha256"] = "cd" * 32
    with SlideServer("abmil-demo", ff.D, encoder_sha256="ef" * 32) as s:
        failed = aggregate(_config(tmp_path, s, force=True)).failed
    assert "made by package cdcdcdcdcdcdcdcd..." in failed["S0"] and "efefefef" in failed["S0"]


def test_fp16_features_are_sent_as_fp16(tmp_path: Path, server: SlideServer) -> None:
    coords = ff.tissue_coords(30)
    features = ff.features_for(coords).astype(np.float16)
    with h5py.File(tmp_path / "H.h5", "w") as f:  # as another tool may store them
        f["features"], f["coords"] = features, coords
    assert aggregate(_config(tmp_path, server)).done == ["H"]
    assert server.seen[-1]["inputs"]["features"] == "float16"
    with h5py.File(tmp_path / "slide_features_abmil-demo" / "H.h5") as f:
        want = server.expected(features.astype(np.float32))["prediction"]
        np.testing.assert_allclose(f["prediction"][()], want, rtol=1e-6)


def test_a_tile_model_is_no_slide_model(tmp_path: Path) -> None:
    from harness.bad_server import BadServer
    from histoserve.errors import UsageError

    _cohort("flat", tmp_path, 1)
    spec = {"family": "embedding", "modes": ["embedding"], "tile_size": 224, "mpp": 0.5}
    tile = {"name": "h0-mini", "spec": spec}
    with (
        BadServer(config=tile, source="pixels") as s,
        pytest.raises(UsageError, match="not a slide"),
    ):
        aggregate(AggregateConfig(tmp_path, (s.url,), "h0-mini"))


def test_the_cli_runs_without_torch_or_kserve(tmp_path: Path, server: SlideServer) -> None:
    _cohort("flat", tmp_path, 1)
    code = (
        "import sys; sys.modules.update(torch=None, kserve=None); "
        "from histoserve.commands.main import main; sys.exit(main(['aggregate', *sys.argv[1:]]))"
    )
    args = [str(tmp_path), "--url", server.url, "--model", "abmil-demo"]
    run = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "1 done" in run.stderr


def test_slides_that_is_no_folder_is_a_usage_error_before_any_slide(
    tmp_path: Path, server: SlideServer, capsys: pytest.CaptureFixture
) -> None:
    _cohort("flat", tmp_path, 1)
    args = [str(tmp_path), "--url", server.url, "--model", "abmil-demo"]
    assert main([*args, "--slides", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert f"--slides {tmp_path / 'nowhere'}: no such folder of slides" in err
    assert not (tmp_path / "slides_status.csv").exists()


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--timeout-s", "inf"), ("--timeout-s", "nan"), ("--timeout-s", "0"),
     ("--max-attempts", "1000000"), ("--slides-in-flight", "0")],
)  # fmt: skip
def test_out_of_range_numbers_are_a_usage_error_before_any_slide(
    tmp_path: Path, server: SlideServer, capsys: pytest.CaptureFixture, flag: str, value: str
) -> None:
    _cohort("flat", tmp_path, 1)
    args = [str(tmp_path), "--url", server.url, "--model", "abmil-demo", flag, value]
    assert main(args) == 2
    assert f"{flag} must be in" in capsys.readouterr().err
    assert not (tmp_path / "slides_status.csv").exists()
