"""``--load_probe``: a package whose native code crashes or hangs on load stops start-up with a message.

The real ``python -m predictor`` is started on a copy of the real demo package
whose shared library was swapped for one whose constructor raises ``SIGSEGV``
or sleeps forever (:mod:`harness.native_crash`): every check before the load
passes, and the loader meets the bad code as it would a package built for
another GPU or from a corrupted inductor cache. With the probe on, start-up
exits 2 with one line naming the package, its build, the signal or the timeout,
the last step and what to do; with it off, the server itself dies by the signal,
and ``faulthandler`` (on in the server either way) leaves the Python stack. A
good package serves with the probe on. The failing starts run in parallel.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness.native_crash import misbehaving_model_dir
from harness.server import start_server
from histoserve import HistoserveClient

pytestmark = pytest.mark.integration
PACKAGE = "h0-mini.pt2"


def _cannot_start(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("histoserve: cannot start")]


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (the probe's children, here)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline and int(entry.name) != os.getpid():
                found.append(int(entry.name))
    return found


def test_a_package_that_crashes_or_hangs_on_load_stops_start_up_with_exit_2(
    embedding_package_dir: Path, tmp_path: Path
) -> None:
    segv = misbehaving_model_dir(embedding_package_dir, "segv", tmp_path / "segv")
    hang = misbehaving_model_dir(embedding_package_dir, "hang", tmp_path / "hang")
    starts = {
        "segv-on": (segv, "--load_probe", "on"),
        "segv-off": (segv, "--load_probe", "off"),
        "hang-on": (hang, "--load_probe", "on", "--load_timeout_s", "10"),
    }
    servers = {
        name: start_server(model_dir, tmp_path / name, *flags, model_name="x", wait=False)
        for name, (model_dir, *flags) in starts.items()
    }
    codes = {name: server.proc.wait(240) for name, server in servers.items()}
    logs = {name: server.log() for name, server in servers.items()}

    assert codes["segv-on"] == 2, logs["segv-on"][-3000:]
    (line,) = _cannot_start(logs["segv-on"])
    assert str(segv / PACKAGE) in line
    assert "torch 2." in line and "cpu package" in line and "-march=" in line  # its build
    assert "signal SIGSEGV" in line and "during step 'load'" in line
    assert "What to do: re-export the package with `histoserve export`" in line
    assert "Fatal Python error: Segmentation fault" in logs["segv-on"]  # the child's stack, logged
    assert "load_package" in logs["segv-on"]

    # Without the probe the server itself dies by the signal: no exit 2, no line, but
    # faulthandler (on in the server) leaves the Python stack where the load crashed.
    assert codes["segv-off"] == -signal.SIGSEGV, logs["segv-off"][-3000:]
    assert not _cannot_start(logs["segv-off"])
    assert "Fatal Python error: Segmentation fault" in logs["segv-off"]
    assert "predictor/pt2/loader.py" in logs["segv-off"]

    assert codes["hang-on"] == 2, logs["hang-on"][-3000:]
    (line,) = _cannot_start(logs["hang-on"])
    assert str(hang / PACKAGE) in line
    assert "did not finish within --load_timeout_s 10 s (killed)" in line
    assert "during step 'load'" in line and "raise --load_timeout_s" in line
    assert "Timeout (" in logs["hang-on"]  # the child's stacks, dumped before the deadline
    assert not _processes_naming(str(hang / PACKAGE))  # its whole process group is gone


def test_a_good_package_serves_with_the_probe_on(
    embedding_package_dir: Path, tmp_path: Path
) -> None:
    server = start_server(embedding_package_dir, tmp_path, "--load_probe", "on")
    try:
        tiles = np.random.default_rng(4).integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)
        with HistoserveClient(server.base, server.model_name) as client:
            embedding = client.infer_pixels(tiles)["embedding"]
        config = httpx.get(f"{server.base}/v2/models/{server.model_name}/config").json()
        log = server.log()
    finally:
        assert server.stop() == 0
    assert embedding.shape == (3, 1536) and np.isfinite(embedding).all()
    phases = config["startup_seconds"]
    assert phases["load_probe"] > 0 and list(phases)[:3] == ["digest", "metadata", "load_probe"]
    assert f"load probe: {PACKAGE} loads and runs in a fresh process" in log
