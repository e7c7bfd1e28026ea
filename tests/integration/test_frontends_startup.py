"""``--frontends N`` start-up: whatever stops a pod stops it at once, with one line and a non-zero exit.

Real ``python -m predictor`` processes on loopback ports with the exported
demo package: a taken port, a second server on a running pod's port, a
``/dev/shm`` too small for the slabs (a file-size limit on the server stands
in for a small tmpfs: ``posix_fallocate`` fails the same way), a model class
that a front end cannot import, and an earlier container's segments left in
``/dev/shm``.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from harness.server import free_port, predictor_command, start_server
from harness.tiles import random_tiles
from histoserve import wire
from predictor.http.listeners import bind_http
from predictor.multiprocess.segments import PREFIX, SHM_DIR

pytestmark = pytest.mark.integration
START_TIMEOUT_S = 120


def _run(model_dir: Path, *flags: str, ports=None, env=None, limit_bytes=None):
    ports = ports or (free_port(), free_port())
    command = predictor_command(model_dir, ports, "--device", "cpu", *flags)

    def limit() -> None:
        if limit_bytes is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        command, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False,
        env=env or dict(os.environ, OMP_NUM_THREADS="1"), preexec_fn=limit,
    )  # fmt: skip


def _one_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("histoserve: cannot")]
    assert len(lines) == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("frontends", ["1", "2"])
@pytest.mark.parametrize("taken", ["http", "grpc"])
def test_a_taken_port_stops_start_up(embedding_package_dir, frontends, taken) -> None:
    ports = (free_port(), free_port())
    holder = bind_http("127.0.0.1", ports[0] if taken == "http" else ports[1])
    try:
        done = _run(embedding_package_dir, "--frontends", frontends, ports=ports)
    finally:
        holder.close()
    assert done.returncode == 2
    port = ports[0] if taken == "http" else ports[1]
    assert f":{port}" in _one_line(done) and "in use" in _one_line(done)


def test_a_second_server_on_a_running_pods_ports_is_refused(embedding_package_dir, tmp_path):
    """With ``SO_REUSEPORT`` the second one silently shared the port: one tile, two models."""
    first = start_server(embedding_package_dir, tmp_path, "--frontends", "2")
    try:
        for frontends in ("1", "2"):
            ports = (first.http_port, free_port())
            assert (
                _run(embedding_package_dir, "--frontends", frontends, ports=ports).returncode == 2
            )
            ports = (free_port(), first.grpc_port)
            assert (
                _run(embedding_package_dir, "--frontends", frontends, ports=ports).returncode == 2
            )
        content, headers = wire.encode_request({"pixels": random_tiles(2, seed=3)})
        url = f"{first.base}/v2/models/{first.model_name}/infer"
        assert httpx.post(url, content=content, headers=headers, timeout=60).status_code == 200
    finally:
        assert first.stop() == 0


def test_a_dev_shm_too_small_stops_start_up_naming_the_size(embedding_package_dir) -> None:
    """It was a SIGBUS of the owner, and of the pod, once a request touched a missing page."""
    done = _run(embedding_package_dir, "--frontends", "2", limit_bytes=32 << 20)
    assert done.returncode == 2
    line = _one_line(done)
    assert "shared-memory slab of" in line and "MiB" in line and "shm.sizeLimit" in line
    assert "2 front ends need" in line


FAILS_IN_A_FRONT_END = """
import sys
if "--frontend_socket" in sys.argv:
    raise ImportError("this model class imports in the device owner only")
from predictor.model.base import BaseServerModel


class OwnerOnly(BaseServerModel):
    pass
"""


def test_a_front_end_that_fails_before_serving_stops_the_pod(embedding_package_dir, tmp_path):
    """It said hello before it bound its port and was restarted in a loop, with no backoff."""
    (tmp_path / "owner_only.py").write_text(FAILS_IN_A_FRONT_END)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tmp_path))
    started = time.monotonic()
    done = _run(
        embedding_package_dir, "--frontends", "2", "--model_class", "owner_only:OwnerOnly", env=env
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "exited 2 before it served" in done.stderr
    assert done.stderr.count("this model class imports in the device owner only") <= 2
    assert "again in" not in done.stderr  # no restart
    assert time.monotonic() - started < START_TIMEOUT_S


def test_segments_an_earlier_container_left_are_swept_at_start(embedding_package_dir, tmp_path):
    stale = SHM_DIR / f"{PREFIX}{'0' * 31}e"
    stale.write_bytes(b"\0" * 4096)
    server = start_server(embedding_package_dir, tmp_path, "--frontends", "2")
    try:
        assert not stale.exists()
        assert f"removed the stale shared-memory segment {stale.name}" in server.log()
        ours = [p for p in SHM_DIR.iterdir() if p.name.startswith(PREFIX)]
        assert len(ours) >= 2  # the running pod's, allocated whole
    finally:
        stale.unlink(missing_ok=True)
        assert server.stop() == 0


def test_front_ends_with_explicit_model_control_are_refused_naming_the_flags(
    embedding_package_dir, tmp_path
):
    """Front ends learn the models the owner loaded at start; a later load or unload in the
    owner would never reach them, so the pair is refused before anything loads."""
    folder = tmp_path / "models" / "h0-mini"
    folder.mkdir(parents=True)
    (folder / "model.pt2").symlink_to(next(embedding_package_dir.glob("*.pt2")))
    started = time.monotonic()
    done = _run(tmp_path / "models", "--frontends", "2", "--model_control", "explicit")
    assert done.returncode == 2, done.stderr[-3000:]
    line = _one_line(done)
    assert "--frontends 2 with --model_control explicit" in line
    assert "--model_control none" in line and "--frontends 1" in line
    assert "loaded" not in done.stderr.split(line)[0].lower()  # refused before any load
    assert time.monotonic() - started < 30
