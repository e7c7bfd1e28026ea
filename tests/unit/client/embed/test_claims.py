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

from predictor.client.embed.claims import ClaimStore
from predictor.client.embed.errors import UsageError

REPO = Path(__file__).resolve().parents[4]

# Claims the ids in argv[2:] in folder argv[1], prints which it got as JSON, then
# holds them until stdin closes (a "go" line first when argv has --wait-go).
HOLDER = """
import json, sys
from pathlib import Path
from predictor.client.embed.claims import ClaimStore
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
