"""Output files: round trip, TRIDENT/CLAM attributes, atomicity, resume checks, status.csv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from harness.slides import GeneratedSlide
from histoserve.results.output import (
    SlideResult,
    config_hash,
    done_attrs,
    final_path,
    is_done,
    plan_attrs,
    write_slide,
)
from histoserve.results.status import StatusLog, read_status
from histoserve.slides.grid import plan_tiles
from histoserve.slides.readers import MppInfo, SlideReader

REPO = Path(__file__).resolve().parents[4]
HASH = config_hash({"model": "h0-mini", "target_mpp": 0.5})


def _result(n: int = 5, attrs: dict | None = None) -> SlideResult:
    rng = np.random.default_rng(0)
    coords = np.stack([np.arange(n) * 448, np.zeros(n)], axis=1).astype(np.int64)
    return SlideResult(
        features=rng.standard_normal((n, 8)).astype(np.float32),
        predictions=rng.standard_normal((n, 3)).astype(np.float32),
        coords=coords,
        tissue_fraction=np.linspace(0.3, 1.0, n).astype(np.float32),
        attrs={"slide_id": "S1", "config_hash": HASH, **(attrs or {})},
    )


def _run(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        **kwargs,
    )


def test_round_trip_with_trident_and_clam_attributes(
    tmp_path: Path, svs_slide: GeneratedSlide
) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        plan = plan_tiles(reader, MppInfo(0.25, "openslide.mpp"), 0.5, 224, 0.05)
        attrs = plan_attrs(reader, plan)
    spec = {"name": "h0-mini", "tile_size": 224}
    result = _result(attrs={**attrs, "spec": spec, "skipped": None, "bad_coords": np.zeros((0, 2))})
    path = write_slide(tmp_path, "S1", result)
    assert path == final_path(tmp_path, "S1") == tmp_path / "S1.h5"
    with h5py.File(path, "r") as f:
        assert f["features"].dtype == np.float32 and f["predictions"].shape == (5, 3)
        assert f["coords"].dtype == np.int64
        np.testing.assert_array_equal(f["features"][:], result.features)
        np.testing.assert_array_equal(f["coords"][:], result.coords)
        np.testing.assert_array_equal(f["tissue_fraction"][:], result.tissue_fraction)
        assert f.attrs["level0_mpp"] == 0.25 and f.attrs["mpp_source"] == "openslide.mpp"
        assert f.attrs["read_level"] == 1 and f.attrs["tile_size"] == 224
        assert json.loads(f.attrs["spec"]) == spec and "skipped" not in f.attrs
        c = dict(f["coords"].attrs)
    # TRIDENT's patching attributes...
    assert c["patch_size"] == 224 and c["patch_size_level0"] == 448
    assert c["level0_magnification"] == 40 and c["target_magnification"] == 20
    assert c["overlap"] == 0 and c["name"] == "S1" and c["savetodir"] == str(tmp_path)
    assert (c["level0_width"], c["level0_height"]) == (3584, 2688)
    # ...and CLAM's (patch_level/downsample/level_dim describe the level actually read).
    assert c["patch_level"] == 1 and list(c["downsample"]) == [2.0, 2.0]
    assert list(c["level_dim"]) == [1792, 1344]
    assert is_done(tmp_path, "S1", HASH)


def test_embedding_only_file(tmp_path: Path) -> None:
    result = _result()
    result.predictions = None
    write_slide(tmp_path, "S1", result)
    with h5py.File(tmp_path / "S1.h5", "r") as f:
        assert "predictions" not in f and f["features"].shape == (5, 8)
    assert is_done(tmp_path, "S1", HASH)


def test_is_done_needs_the_same_hash_and_a_complete_file(tmp_path: Path) -> None:
    assert not is_done(tmp_path, "S1", HASH)  # nothing there
    write_slide(tmp_path, "S1", _result())
    assert is_done(tmp_path, "S1", HASH)
    assert not is_done(tmp_path, "S1", config_hash({"model": "other"}))
    # A file without the completion mark (written by something else, or half-way) is not trusted.
    with h5py.File(tmp_path / "S2.h5", "w") as f:
        f["coords"] = np.zeros((2, 2), np.int64)
        f.attrs["config_hash"] = HASH
    assert not is_done(tmp_path, "S2", HASH)
    # Nor is garbage, or a file cut short.
    (tmp_path / "S3.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    assert not is_done(tmp_path, "S3", HASH)
    data = (tmp_path / "S1.h5").read_bytes()
    (tmp_path / "S4.h5").write_bytes(data[: len(data) // 2])
    assert not is_done(tmp_path, "S4", HASH)


def test_a_fifo_or_symlink_at_the_done_name_is_not_done_and_is_replaced(tmp_path: Path) -> None:
    """Never opened blocking: a FIFO planted at ``<out>/<id>.h5`` hung every run before."""
    os.mkfifo(tmp_path / "S1.h5")
    assert done_attrs(tmp_path / "S1.h5", HASH) is None  # at once, not a hang
    assert not is_done(tmp_path, "S1", HASH)
    write_slide(tmp_path / "elsewhere", "S2", _result())
    (tmp_path / "S2.h5").symlink_to(tmp_path / "elsewhere" / "S2.h5")
    assert is_done(tmp_path / "elsewhere", "S2", HASH) and not is_done(tmp_path, "S2", HASH)
    write_slide(tmp_path, "S1", _result())  # the slide written: the FIFO replaced
    assert is_done(tmp_path, "S1", HASH) and (tmp_path / "S1.h5").is_file()


def test_a_crash_before_the_rename_leaves_the_old_file_and_a_temp_nobody_trusts(
    tmp_path: Path,
) -> None:
    write_slide(tmp_path, "S1", _result(attrs={"config_hash": "old"}))
    # A writer SIGKILLed at the worst moment: its temp file is complete, not yet renamed.
    code = f"""
import os, signal
import numpy as np
from pathlib import Path
import histoserve.atomic as atomic
import histoserve.results.output as out
atomic.os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
r = out.SlideResult(np.ones((3, 4), np.float32), None, np.zeros((3, 2), np.int64),
                    np.ones(3, np.float32), {{"config_hash": {HASH!r}}})
out.write_slide(Path({str(tmp_path)!r}), "S1", r)
"""
    proc = _run(code)
    proc.communicate(timeout=60)
    assert proc.returncode == -9
    temps = [p.name for p in tmp_path.iterdir() if p.name != "S1.h5"]
    assert len(temps) == 1 and temps[0].startswith(".S1.h5.") and temps[0].endswith(".tmp")
    assert not is_done(tmp_path, "S1", HASH)  # the new config is not done...
    assert is_done(tmp_path, "S1", "old")  # ...and the old file is intact


def test_rows_of_different_lengths_write_nothing(tmp_path: Path) -> None:
    result = _result()
    result.tissue_fraction = result.tissue_fraction[:3]
    with pytest.raises(ValueError, match="tissue_fraction has 3 rows but coords has 5"):
        write_slide(tmp_path, "S1", result)
    assert list(tmp_path.iterdir()) == []


def test_config_hash_is_stable_across_processes_and_key_order() -> None:
    settings = {"model": "h0-mini", "target_mpp": 0.5, "tissue": ["otsu", 0.25], "sha": "ab"}
    reordered = dict(reversed(list(settings.items())))
    assert config_hash(reordered) == config_hash(settings)
    assert config_hash({**settings, "target_mpp": 0.25}) != config_hash(settings)
    code = f"from histoserve.results.output import config_hash; print(config_hash({settings!r}))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin"},
    )
    assert out.stdout.strip() == config_hash(settings)


def test_status_log_header_once_and_one_line_per_slide(tmp_path: Path) -> None:
    log = StatusLog(tmp_path)
    log.append("S1", "/d/S1.svs", "done", 120, 3.25)
    log.append("S2", "/d/S2,x.svs", "failed", 0, 0.5, "cannot open\nslide: bad, file")
    lines = (tmp_path / "status.csv").read_text().splitlines()
    assert lines[0] == "slide_id,path,status,n_tiles,seconds,error" and len(lines) == 3
    rows = read_status(tmp_path)
    assert rows[0] == {
        "slide_id": "S1",
        "path": "/d/S1.svs",
        "status": "done",
        "n_tiles": "120",
        "seconds": "3.250",
        "error": "",
    }
    assert rows[1]["path"] == "/d/S2,x.svs" and rows[1]["error"] == "cannot open slide: bad, file"
    with pytest.raises(ValueError, match="status must be one of"):
        log.append("S3", "x", "ok", 0, 0.0)


def test_status_log_from_two_processes(tmp_path: Path) -> None:
    n = 300
    code = f"""
import sys
from pathlib import Path
from histoserve.results.status import StatusLog
log = StatusLog(Path({str(tmp_path)!r}))
sys.stdin.readline()  # start together
for i in range(n := {n}):
    log.append(f"{{sys.argv[1]}}-{{i}}", "p" * 200, "done", i, 0.1, "e" * 300)
"""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, name], cwd=REPO, text=True, stdin=subprocess.PIPE
        )
        for name in ("a", "b")
    ]
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0
    text = (tmp_path / "status.csv").read_text()
    assert text.count("slide_id,path,status") == 1
    rows = read_status(tmp_path)
    assert len(rows) == 2 * n
    assert {r["slide_id"] for r in rows} == {f"{p}-{i}" for p in "ab" for i in range(n)}
    assert all(r["error"] == "e" * 300 and r["path"] == "p" * 200 for r in rows)


def test_status_log_needs_an_existing_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        StatusLog(tmp_path / "absent")
