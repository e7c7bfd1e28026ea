"""The output folder's settings record: written whole, compared, held, replaced only by --force."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from histoserve.embedding.settings import differences
from histoserve.errors import UsageError
from histoserve.results.run_record import RUN_FILE, hold_folder

A = {"model": "h0-mini", "target_mpp": 0.5, "layout": "flat"}
B = {**A, "target_mpp": 1.0}


def _hold(out: Path, settings: dict, *, force: bool = False, check=lambda: None):
    return hold_folder(out, settings, differences, check, force=force)


def test_the_first_run_records_its_settings_and_equal_ones_share_the_folder(
    tmp_path: Path,
) -> None:
    checked = []
    with _hold(tmp_path, A, check=lambda: checked.append(1)):
        record = json.loads((tmp_path / RUN_FILE).read_text())
        assert record["format"] == 1 and record["settings"] == A
        with _hold(tmp_path, dict(A)):  # a second run with the same settings
            pass
    assert checked == [1]  # the unrecorded folder's files are checked once, before the record
    assert [p.name for p in tmp_path.iterdir()] == [RUN_FILE]  # no temp file left


def test_other_settings_are_refused_naming_each_field(tmp_path: Path) -> None:
    _hold(tmp_path, A).release()
    with pytest.raises(UsageError) as err:
        _hold(tmp_path, B)
    assert "target mpp (--target-mpp): 0.5 -> 1.0" in str(err.value)
    assert "--force" in str(err.value) and "another --out" in str(err.value)
    assert json.loads((tmp_path / RUN_FILE).read_text())["settings"] == A


def test_force_replaces_the_record_only_when_no_other_run_holds_it(tmp_path: Path) -> None:
    first = _hold(tmp_path, A)
    with pytest.raises(UsageError, match="another histoserve embed is writing"):
        _hold(tmp_path, B, force=True)
    first.release()
    with _hold(tmp_path, B, force=True):
        assert json.loads((tmp_path / RUN_FILE).read_text())["settings"] == B
        with pytest.raises(UsageError, match=r"0\.5 -> 1\.0|1\.0 -> 0\.5"):
            _hold(tmp_path, A)  # the old settings now differ from the record


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"", "is empty"), (b"{not json", "is not JSON"), (b'{"format": 9, "settings": {}}', "format 9"),
     (b"[]", "no settings object"),
     (b"[" * 1000 + b"]" * 1000, "is JSON nested 1000 deep, more than the 64 allowed")],
)  # fmt: skip
def test_an_unreadable_record_is_a_usage_error_naming_it(
    tmp_path: Path, content: bytes, why: str
) -> None:
    (tmp_path / RUN_FILE).write_bytes(content)
    with pytest.raises(UsageError) as err:
        _hold(tmp_path, A)
    assert str(tmp_path / RUN_FILE) in str(err.value) and why in str(err.value)
    with _hold(tmp_path, A, force=True):  # --force records this run's settings
        assert json.loads((tmp_path / RUN_FILE).read_text())["settings"] == A


def test_a_symlink_or_fifo_is_never_followed_nor_replaced(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"format": 1, "settings": A}))
    (tmp_path / RUN_FILE).symlink_to(target)
    for force in (False, True):
        with pytest.raises(UsageError, match="symbolic link"):
            _hold(tmp_path, A, force=force)
    assert (tmp_path / RUN_FILE).is_symlink()
    (tmp_path / RUN_FILE).unlink()
    os.mkfifo(tmp_path / RUN_FILE)
    with pytest.raises(UsageError, match="FIFO"):
        _hold(tmp_path, A)


def test_an_unrecorded_folder_made_otherwise_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    def refuse() -> None:
        raise UsageError("S1.h5 was made with other settings")

    with pytest.raises(UsageError, match=r"S1\.h5"):
        _hold(tmp_path, A, check=refuse)
    assert not list(tmp_path.iterdir())
    with _hold(tmp_path, A, force=True, check=refuse):  # --force does not ask
        pass


def test_runs_racing_on_an_empty_folder_never_both_hold_it(tmp_path: Path) -> None:
    for attempt in range(20):
        out = tmp_path / str(attempt)
        out.mkdir()
        start, results = threading.Barrier(2), {}

        def run(name: str, settings: dict, out: Path = out, start=start, results=results) -> None:
            start.wait()
            try:
                results[name] = _hold(out, settings)
            except UsageError as exc:
                results[name] = exc

        threads = [threading.Thread(target=run, args=a) for a in (("a", A), ("b", B))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        held = [r for r in results.values() if not isinstance(r, UsageError)]
        assert len(held) == 1, results
        held[0].release()
