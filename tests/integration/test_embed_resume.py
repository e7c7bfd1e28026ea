"""``histoserve embed`` under crashes, races and failing servers: nothing lost, nothing twice.

- SIGKILL mid-run, then the same command again: finished slides are skipped, a
  partial file is never taken for done, the files equal a clean run's;
- two runs at once on one folder: every slide embedded exactly once (the
  server's own tile counter agrees);
- a server failing every 3rd batch (the test-only ``--fault_injection`` hook):
  complete, correct files;
- two servers, one behind an ``http://`` and one behind a ``grpc://`` URL: both
  receive work (their own tile counters), the files are correct.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from harness import slides
from harness.embed import (
    REPO,
    by_status,
    embed_command,
    read_output,
    run_embed,
    status_rows,
    tiles_served,
)
from harness.server import Server, start_server

pytestmark = pytest.mark.integration
N_SLIDES = 4
TILES_PER_SLIDE = 48  # 3584x2688 at 0.25 um/px, 448 px tiles, --tissue none
RUN = ("--tissue", "none", "--batch-size", "4")


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Four copies of one SVS under four slide ids (s0..s3)."""
    root = tmp_path_factory.mktemp("cohort")
    first = slides.aperio_svs(root / "s0.svs")
    copies = [slides.copy_slide(first, root / f"s{i}.svs") for i in range(1, N_SLIDES)]
    return [first.path, *(c.path for c in copies)]


@pytest.fixture(scope="module")
def clean(embedding_server: Server, cohort: list[Path], tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clean")
    result = run_embed(*cohort, "--url", embedding_server.base, "--out", out, *RUN)
    assert result.returncode == 0, result.stderr
    return out


def _assert_same(out: Path, clean: Path, slide_id: str) -> None:
    got, want = read_output(out / f"{slide_id}.h5"), read_output(clean / f"{slide_id}.h5")
    np.testing.assert_array_equal(got["coords"], want["coords"])
    np.testing.assert_array_equal(got["tissue_fraction"], want["tissue_fraction"])
    np.testing.assert_allclose(got["features"], want["features"], rtol=1e-4, atol=1e-5)
    assert got["attrs"]["config_hash"] == want["attrs"]["config_hash"]
    assert len(got["coords"]) == TILES_PER_SLIDE


def _signal_after_first_slide(args: tuple, sig: signal.Signals) -> subprocess.Popen:
    """``histoserve embed`` started on ``args`` and sent ``sig`` once its first slide is done."""
    proc = subprocess.Popen(
        embed_command(*args, "--progress", "plain"),
        cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    for line in proc.stderr:  # the per-slide line is printed after its status row
        if ": done (" in line:
            proc.send_signal(sig)
            break
    return proc


def test_sigkill_then_rerun_equals_a_clean_run(
    embedding_server: Server, cohort: list[Path], clean: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = (*cohort, "--url", embedding_server.base, "--out", out, *RUN, "--concurrency", "1")
    proc = _signal_after_first_slide(args, signal.SIGKILL)
    try:
        proc.stderr.read()
    finally:
        proc.wait(60)
    assert proc.returncode == -signal.SIGKILL
    done = by_status(status_rows(out)).get("done", [])
    # A slide whose file was renamed into place just before the kill, with its
    # status row not yet written, is finished too: the rerun must skip it.
    finished = sorted(p.stem for p in out.glob("s*.h5"))
    assert len(done) >= 1 and set(done) <= set(finished) and len(finished) < N_SLIDES
    done = finished
    pending = [f"s{i}" for i in range(N_SLIDES) if f"s{i}" not in done]
    # A partial file under a final name (a crash of a non-atomic writer, a cut copy).
    data = (out / f"{done[0]}.h5").read_bytes()
    (out / f"{pending[-1]}.h5").write_bytes(data[: len(data) // 2])
    rows_before = len(status_rows(out))

    result = run_embed(*args)
    assert result.returncode == 0, result.stderr
    rerun = by_status(status_rows(out)[rows_before:])
    assert sorted(rerun.get("skipped", [])) == sorted(done)
    assert sorted(rerun.get("done", [])) == sorted(pending)
    for i in range(N_SLIDES):
        _assert_same(out, clean, f"s{i}")
    assert not list(out.glob(".*.tmp"))


def test_two_concurrent_runs_embed_each_slide_once(
    embedding_server: Server, cohort: list[Path], clean: Path, tmp_path: Path
) -> None:
    before = tiles_served(embedding_server.base).get("ok", 0)
    args = (*cohort, "--url", embedding_server.base, "--out", tmp_path, *RUN)
    procs = [
        subprocess.Popen(
            embed_command(*args, "--progress", "none"), cwd=REPO, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    statuses = by_status(status_rows(tmp_path))
    assert sorted(statuses["done"]) == [f"s{i}" for i in range(N_SLIDES)]  # once each
    assert sorted(statuses.get("skipped", [])) == sorted(statuses["done"])  # the other run
    served = tiles_served(embedding_server.base).get("ok", 0) - before
    assert served == N_SLIDES * TILES_PER_SLIDE
    for i in range(N_SLIDES):
        _assert_same(tmp_path, clean, f"s{i}")


@pytest.fixture(scope="module")
def faulty(embedding_package_dir: Path, tmp_path_factory) -> Iterator[Server]:
    flags = ("--max_batch_size", "8", "--fault_injection", "every:3")
    server = start_server(embedding_package_dir, tmp_path_factory.mktemp("faulty"), *flags)
    yield server
    server.stop()


def test_failing_batches_are_retried_into_complete_files(
    faulty: Server, cohort: list[Path], clean: Path, tmp_path: Path
) -> None:
    before = tiles_served(faulty.base)
    result = run_embed(*cohort[:2], "--url", faulty.base, "--out", tmp_path, *RUN)
    assert result.returncode == 0, result.stderr
    after = tiles_served(faulty.base)
    assert after.get("failed", 0) > before.get("failed", 0)  # batches did fail (503)
    assert after["ok"] - before.get("ok", 0) == 2 * TILES_PER_SLIDE
    for slide_id in ("s0", "s1"):
        _assert_same(tmp_path, clean, slide_id)


@pytest.fixture(scope="module")
def second(embedding_package_dir: Path, tmp_path_factory) -> Iterator[Server]:
    """Another healthy replica (the faulty one is passed over after each failure)."""
    flags = ("--max_batch_size", "8")
    server = start_server(embedding_package_dir, tmp_path_factory.mktemp("second"), *flags)
    yield server
    server.stop()


def test_two_servers_http_and_grpc_both_receive_work(
    embedding_server: Server, second: Server, cohort: list[Path], clean: Path, tmp_path: Path
) -> None:
    before = tiles_served(embedding_server.base), tiles_served(second.base)
    urls = ("--url", embedding_server.base, "--url", f"grpc://{second.grpc_url}")
    result = run_embed(*cohort, *urls, "--out", tmp_path, *RUN, "--concurrency", "4")
    assert result.returncode == 0, result.stderr
    after = tiles_served(embedding_server.base), tiles_served(second.base)
    gained = [a.get("ok", 0) - b.get("ok", 0) for a, b in zip(after, before, strict=True)]
    assert all(g > 0 for g in gained), gained
    assert sum(gained) == N_SLIDES * TILES_PER_SLIDE
    for i in range(N_SLIDES):
        _assert_same(tmp_path, clean, f"s{i}")


def test_a_grpc_url_alone_describes_the_model_and_matches(
    embedding_server: Server, cohort: list[Path], clean: Path, tmp_path: Path
) -> None:
    """A grpc:// URL gives what an http:// one does: the one model served (RepositoryIndex),
    its spec, mpp and package digest (ModelConfig), so no --model and no --target-mpp."""
    url = ("--url", f"grpc://{embedding_server.grpc_url}")
    result = run_embed(cohort[0], *url, "--out", tmp_path, *RUN)
    assert result.returncode == 0, result.stderr
    got, want = read_output(tmp_path / "s0.h5"), read_output(clean / "s0.h5")
    np.testing.assert_array_equal(got["coords"], want["coords"])
    np.testing.assert_allclose(got["features"], want["features"], rtol=1e-4, atol=1e-5)
    assert got["attrs"]["package_sha256"] == want["attrs"]["package_sha256"]  # the real digest
    assert got["attrs"]["spec"] == want["attrs"]["spec"]


def test_ctrl_c_stops_at_once_and_the_rerun_resumes(
    embedding_server: Server, cohort: list[Path], clean: Path, tmp_path: Path
) -> None:
    args = (*cohort, "--url", embedding_server.base, "--out", tmp_path, *RUN, "--concurrency", "1")
    proc = _signal_after_first_slide(args, signal.SIGINT)
    try:
        tail = proc.stderr.read()
    finally:
        proc.wait(20)  # not the minutes the slides in progress would take
    assert proc.returncode == 130 and "run the same command again to resume" in tail
    done = by_status(status_rows(tmp_path)).get("done", [])
    assert 1 <= len(done) < N_SLIDES
    result = run_embed(*args)
    assert result.returncode == 0, result.stderr
    for i in range(N_SLIDES):
        _assert_same(tmp_path, clean, f"s{i}")
