"""An output folder knows the settings its files were made with.

Real parts: generated slides, the demo package served by ``python -m
predictor`` on loopback, ``histoserve embed`` in its own interpreter.

- a run with another ``--target-mpp`` into a folder is exit 2 before any
  slide, naming the field (old -> new), and writes nothing;
- the same settings resume with nothing embedded again;
- ``--force`` embeds with the new settings and the folder records them;
- an unreadable record is exit 2 naming it;
- a run with other settings is refused while another holds the folder, even
  with ``--force``; two runs with different settings started together on an
  empty folder: one writes, the other is exit 2;
- a folder made before the record existed is adopted when its files agree,
  else exit 2 naming the file and the field.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import h5py
import pytest

from harness import slides
from harness.embed import REPO, by_status, embed_command, read_output, run_embed, status_rows
from harness.server import Server
from histoserve.embedding.settings import RUN_SETTINGS_ATTR, differences
from histoserve.results.run_record import RUN_FILE, hold_folder

pytestmark = pytest.mark.integration
# 1792x1344 at 0.25 um/px, --tissue none: 12 tiles of 224 px at 0.5 um/px, 2 at 1.0.
RUN = ("--tissue", "none", "--batch-size", "8", "--no-qc")
COARSE = ("--target-mpp", "1.0")
SMALL = {"width": 1792, "height": 1344}


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("settings-slides")
    first = slides.aperio_svs(root / "s0.svs", boxes=((448, 448, 896, 448),), **SMALL)
    return [first.path, slides.copy_slide(first, root / "s1.svs").path]


@pytest.fixture(scope="module")
def made(embedding_server: Server, cohort: list[Path], tmp_path_factory) -> Path:
    """A folder one default run made (target mpp 0.5 from the model's spec)."""
    out = tmp_path_factory.mktemp("made") / "out"
    result = run_embed(*cohort, "--url", embedding_server.base, "--out", out, *RUN)
    assert result.returncode == 0, result.stderr
    return out


def _copy(made: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(made, tmp_path / "out"))


def _embed(server: Server, cohort: list[Path], out: Path, *args: str):
    return run_embed(*cohort, "--url", server.base, "--out", out, *RUN, *args)


def _files(out: Path) -> dict[str, tuple[int, int]]:
    """Every file below ``out`` with its size and mtime: what a run wrote or changed."""
    return {
        str(p.relative_to(out)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in out.rglob("*")
        if p.is_file()
    }


def _sorted(statuses: dict[str, list[str]]) -> dict[str, list[str]]:
    return {status: sorted(ids) for status, ids in statuses.items()}


def _settings(out: Path) -> dict:
    return json.loads((out / RUN_FILE).read_text())["settings"]


def test_another_target_mpp_is_exit_2_naming_it_and_writes_nothing(
    embedding_server: Server, cohort: list[Path], made: Path, tmp_path: Path
) -> None:
    out = _copy(made, tmp_path)
    assert _settings(out)["target_mpp"] == 0.5
    before = _files(out)
    result = _embed(embedding_server, cohort, out, *COARSE)
    assert result.returncode == 2, result.stderr
    assert "target mpp (--target-mpp): 0.5 -> 1.0" in result.stderr
    assert "another --out" in result.stderr and "--force" in result.stderr
    assert "Traceback" not in result.stderr
    assert _files(out) == before


def test_the_same_settings_resume_with_nothing_embedded_again(
    embedding_server: Server, cohort: list[Path], made: Path, tmp_path: Path
) -> None:
    out = _copy(made, tmp_path)
    rows = len(status_rows(out))
    result = _embed(embedding_server, cohort, out)
    assert result.returncode == 0, result.stderr
    assert _sorted(by_status(status_rows(out)[rows:])) == {"skipped": ["s0", "s1"]}


def test_force_embeds_with_the_new_settings_and_records_them(
    embedding_server: Server, cohort: list[Path], made: Path, tmp_path: Path
) -> None:
    out = _copy(made, tmp_path)
    result = _embed(embedding_server, cohort, out, *COARSE, "--force")
    assert result.returncode == 0, result.stderr
    assert _settings(out)["target_mpp"] == 1.0
    for slide_id in ("s0", "s1"):
        written = read_output(out / f"{slide_id}.h5")
        assert written["attrs"]["target_mpp"] == 1.0 and len(written["coords"]) == 2
        assert json.loads(written["attrs"][RUN_SETTINGS_ATTR]) == _settings(out)
    again = _embed(embedding_server, cohort, out)  # the old settings now differ
    assert again.returncode == 2 and "target mpp (--target-mpp): 1.0 -> 0.5" in again.stderr


def test_an_unreadable_record_is_exit_2_naming_it(
    embedding_server: Server, cohort: list[Path], made: Path, tmp_path: Path
) -> None:
    out = _copy(made, tmp_path)
    (out / RUN_FILE).write_text('{"format": 1, "settings": {"model": "h0-mi')
    result = _embed(embedding_server, cohort, out)
    assert result.returncode == 2
    assert str(out / RUN_FILE) in result.stderr and "not JSON" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_run_with_other_settings_is_refused_while_the_folder_is_held(
    embedding_server: Server, cohort: list[Path], made: Path, tmp_path: Path
) -> None:
    out = _copy(made, tmp_path)
    before = _files(out)
    # The first run's hold, as the pipeline takes it, with the settings it recorded.
    with hold_folder(out, _settings(out), differences, lambda: None):
        result = _embed(embedding_server, cohort, out, *COARSE, "--force")
    assert result.returncode == 2, result.stderr
    assert "another histoserve embed is writing" in result.stderr
    assert _files(out) == before


def test_two_runs_with_other_settings_started_together_never_both_write(
    embedding_server: Server, cohort: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    runs = {"fine": (), "coarse": COARSE}

    def start(*args: str) -> subprocess.Popen:
        command = embed_command(*cohort, "--url", embedding_server.base, "--out", out, *RUN, *args)
        return subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

    procs = {name: start(*args) for name, args in runs.items()}
    errors = {name: p.communicate(timeout=300)[1] for name, p in procs.items()}
    codes = {name: p.returncode for name, p in procs.items()}
    assert sorted(codes.values()) == [0, 2], errors
    winner = next(name for name, code in codes.items() if code == 0)
    mpp = 1.0 if winner == "coarse" else 0.5
    assert _settings(out)["target_mpp"] == mpp
    assert {read_output(out / f"s{i}.h5")["attrs"]["target_mpp"] for i in (0, 1)} == {mpp}
    assert len(status_rows(out)) == 2  # the loser wrote no status line


def _as_older_histoserve(out: Path) -> None:
    """The folder as a histoserve before the record left it: no record, no copy in the files."""
    (out / RUN_FILE).unlink()
    for path in out.glob("*.h5"):
        with h5py.File(path, "a") as f:
            f.attrs.pop(RUN_SETTINGS_ATTR, None)


def test_a_folder_older_than_the_record_is_adopted_when_its_files_agree(
    embedding_server: Server, cohort: list[Path], made: Path, tmp_path: Path
) -> None:
    out = _copy(made, tmp_path)
    _as_older_histoserve(out)
    rows = len(status_rows(out))
    result = _embed(embedding_server, cohort, out)
    assert result.returncode == 0, result.stderr
    assert _sorted(by_status(status_rows(out)[rows:])) == {"skipped": ["s0", "s1"]}
    assert _settings(out)["target_mpp"] == 0.5

    _as_older_histoserve(out)
    before = _files(out)
    result = _embed(embedding_server, cohort, out, *COARSE)
    assert result.returncode == 2, result.stderr
    assert str(out / "s0.h5") in result.stderr
    assert "target mpp (--target-mpp): 0.5 -> 1.0" in result.stderr
    assert _files(out) == before
