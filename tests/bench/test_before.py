"""``bench.servers.before``: the pre-issue-12 server extracted from this repository's history."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.servers import before
from harness.server import REPO


def _has_commit(commit: str) -> bool:
    probe = ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def test_source_tree_holds_that_commits_predictor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(before, "cache_root", lambda: tmp_path)
    if not _has_commit(before.BEFORE_COMMIT):  # a shallow clone: the error says which commit
        with pytest.raises(RuntimeError, match=before.BEFORE_COMMIT):
            before.source_tree()
        return
    tree = before.source_tree()
    want = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{before.BEFORE_COMMIT}:predictor/cli.py"],
        capture_output=True,
        check=True,
    ).stdout
    assert (tree / "predictor" / "cli.py").read_bytes() == want
    assert before.source_tree() == tree  # extracted once, then reused


def test_unknown_commit_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(before, "cache_root", lambda: tmp_path)
    with pytest.raises(RuntimeError, match="cannot extract predictor/ at 0000000"):
        before.source_tree("0000000")
    assert list(tmp_path.iterdir()) == []  # nothing half-extracted left behind
