"""Claims: one holder per slide across processes; a SIGKILLed holder's claim is free at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from histoserve.errors import SlideError, UsageError
from histoserve.results.claims import ClaimStore

REPO = Path(__file__).resolve().parents[4]

# Claims the ids in argv[2:] in folder argv[1], prints which it got as JSON, then
# holds them until stdin closes (a "go" line first when argv has --wait-go).
HOLDER = """
import json, sys
from pathlib import Path
from histoserve.results.claims import ClaimStore
args = sys.argv[1:]
wait_go = args[0] == "--wait-go"
if wait_go:
    args = args[1:]
store = ClaimStore(Path(args[0]))
if wait_go:
    sys.stdin.readline()
held = {i: store.try_claim(i) for i in args[1:]}
print(json.dumps(sorted(i for i, c in held.items() if c is not None)), flush=True)
sys.stdin.read()
for claim in held.values():
    if claim is not None:
        claim.release()
"""


def _holder(out: Path, *ids: str, wait_go: bool = False) -> subprocess.Popen:
    args = ["--wait-go"] if wait_go else []
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, *args, str(out), *ids],
        cwd=REPO,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def test_one_process_cannot_claim_a_slide_twice(tmp_path: Path) -> None:
    store = ClaimStore(tmp_path)
    claim = store.try_claim("S1")
    assert claim is not None and claim.held
    assert store.try_claim("S1") is None
    assert ClaimStore(tmp_path).try_claim("S1") is None
    other = store.try_claim("S2")
    assert other is not None
    claim.release()
    claim.release()  # idempotent
    assert not claim.held and not (tmp_path / ".claims" / "S1.lock").exists()
    with store.try_claim("S1") as again:
        assert again is not None and again.held
    assert not again.held
    other.release()


def test_the_lock_file_names_its_holder(tmp_path: Path) -> None:
    with ClaimStore(tmp_path).try_claim("S1") as claim:
        text = claim.path.read_text()
    assert f"pid={os.getpid()} " in text and "host=" in text


def test_a_live_holder_in_another_process_blocks_until_it_releases(tmp_path: Path) -> None:
    proc = _holder(tmp_path, "S1")
    assert json.loads(proc.stdout.readline()) == ["S1"]
    store = ClaimStore(tmp_path)
    assert store.try_claim("S1") is None
    proc.stdin.close()  # the holder releases and exits
    assert proc.wait(timeout=60) == 0
    claim = store.try_claim("S1")
    assert claim is not None
    claim.release()


def test_a_sigkilled_holders_claim_is_taken_over_at_once(tmp_path: Path) -> None:
    proc = _holder(tmp_path, "S1", "S2")
    assert json.loads(proc.stdout.readline()) == ["S1", "S2"]
    store = ClaimStore(tmp_path)
    assert store.try_claim("S1") is None
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    # The lock file is still there (nobody cleaned up), yet the claim is free now.
    assert (tmp_path / ".claims" / "S1.lock").exists()
    start = time.monotonic()
    claims = [store.try_claim("S1"), store.try_claim("S2")]
    assert all(c is not None for c in claims)
    assert time.monotonic() - start < 1.0
    assert f"pid={os.getpid()} " in (tmp_path / ".claims" / "S1.lock").read_text()
    for claim in claims:
        claim.release()


def test_two_processes_racing_for_the_same_slides_split_them(tmp_path: Path) -> None:
    ids = [f"S{i:03d}" for i in range(200)]
    procs = [_holder(tmp_path, *ids, wait_go=True) for _ in range(2)]
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    got = [set(json.loads(proc.stdout.readline())) for proc in procs]
    for proc in procs:
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    assert not (got[0] & got[1])
    assert got[0] | got[1] == set(ids)


def test_claims_refuse_unsafe_ids(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="plain file name"):
        ClaimStore(tmp_path).try_claim("../escape")


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "outside" / "thesis.txt"
    victim.parent.mkdir()
    victim.write_text("a user's file, outside --out\n")
    return victim


def test_a_symlink_planted_at_a_lock_fails_the_slide_and_its_target_is_untouched(
    tmp_path: Path,
) -> None:
    victim, out = _victim(tmp_path), tmp_path / "out"
    store = ClaimStore(out)
    lock = out / ".claims" / "S1.lock"
    lock.symlink_to(victim)
    with pytest.raises(SlideError, match=r"S1\.lock is a symbolic link.*remove it"):
        store.try_claim("S1")
    (out / ".claims" / "S2.lock").symlink_to(tmp_path / "outside" / "new.txt")  # dangling
    with pytest.raises(SlideError, match="symbolic link"):
        store.try_claim("S2")
    assert victim.read_text() == "a user's file, outside --out\n"
    assert not (tmp_path / "outside" / "new.txt").exists()
    assert lock.is_symlink()  # left for the user to look at, not removed
    with store.try_claim("S3") as claim:  # the other slides are claimed as ever
        assert claim.held


def test_a_hard_link_fifo_or_folder_at_a_lock_is_refused(tmp_path: Path) -> None:
    victim, out = _victim(tmp_path), tmp_path / "out"
    store = ClaimStore(out)
    os.link(victim, out / ".claims" / "linked.lock")
    os.mkfifo(out / ".claims" / "fifo.lock")
    (out / ".claims" / "folder.lock").mkdir()
    with pytest.raises(SlideError, match=r"linked\.lock has 2 hard links"):
        store.try_claim("linked")
    with pytest.raises(SlideError, match=r"fifo\.lock is not a regular file"):
        store.try_claim("fifo")
    with pytest.raises(SlideError, match=r"folder\.lock cannot be opened"):
        store.try_claim("folder")
    assert victim.read_text() == "a user's file, outside --out\n"


def test_a_claims_folder_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / ".claims").symlink_to(elsewhere)
    with pytest.raises(UsageError, match=r"\.claims is a symbolic link"):
        ClaimStore(out)
    dangling = tmp_path / "out2"
    dangling.mkdir()
    (dangling / ".claims").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UsageError, match=r"\.claims cannot be created"):
        ClaimStore(dangling)
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "nowhere").exists()


def test_a_claims_folder_swapped_for_a_symlink_mid_run_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = ClaimStore(tmp_path / "out")
    held = store.try_claim("S1")
    (tmp_path / "out" / ".claims").rename(tmp_path / "moved")
    (tmp_path / "out" / ".claims").symlink_to(elsewhere)
    with pytest.raises(UsageError, match="symbolic link"):
        store.try_claim("S2")
    held.release()  # unlinks its own file, in the folder it was made in
    assert list(elsewhere.iterdir()) == [] and list((tmp_path / "moved").iterdir()) == []
