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

At the defaults (``--load_probe auto``) a CPU package this host has not
loaded before is probed too (:mod:`predictor.packages.probe_record`): a library
that crashes (SIGSEGV, SIGBUS), hangs or calls ``_exit(0)`` on load is exit 2
naming the package, the step and the signal; in a package set, a broken
preferred build gives way to the next fitting build of the model, and the log
says so. Each server gets a fresh record (``XDG_CACHE_HOME``).
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness.native_crash import misbehaving_model_dir, native_library, swap_library
from harness.packages import demo_package
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
    assert "predictor/runtime/loader.py" in logs["segv-off"]

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


def test_at_the_defaults_a_cpu_package_that_crashes_hangs_or_exits_on_load_is_exit_2(
    embedding_package_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "record"))  # this host: never loaded them
    dirs = {
        b: misbehaving_model_dir(embedding_package_dir, b, tmp_path / b)
        for b in ("segv", "bus", "exit0", "hang")
    }
    # a package set: the preferred (native) build's library is broken, the portable one is good
    package_set = tmp_path / "set"
    package_set.mkdir()
    native, portable = (
        demo_package("h0-mini"),
        demo_package("h0-mini", cpu_target="x86-64-v3", max_batch=8),
    )
    swap_library(native, native_library("bus", tmp_path / ".bus"), package_set / "a-native.pt2")
    shutil.copy2(portable, package_set / "b-portable.pt2")
    servers = {
        b: start_server(d, tmp_path / f"log-{b}", *(("--load_timeout_s", "10") if b == "hang" else ()),
                        model_name="x", wait=False)
        for b, d in dirs.items()
    }  # fmt: skip
    in_set = start_server(package_set, tmp_path / "log-set", "--max_batch_size", "8")
    try:
        tiles = np.random.default_rng(5).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
        with HistoserveClient(in_set.base, in_set.model_name) as client:
            embedding = client.infer_pixels(tiles)["embedding"]
        config = httpx.get(f"{in_set.base}/v2/models/{in_set.model_name}/config").json()
        set_log = in_set.log()
    finally:
        assert in_set.stop() == 0
    codes = {b: server.proc.wait(240) for b, server in servers.items()}
    logs = {b: server.log() for b, server in servers.items()}

    expected = {
        "segv": "was killed by signal SIGSEGV",
        "bus": "was killed by signal SIGBUS",
        "exit0": "exited with status 0 before it finished",
        "hang": "did not finish within --load_timeout_s 10 s (killed)",
    }
    for behaviour, how in expected.items():
        assert codes[behaviour] == 2, logs[behaviour][-3000:]
        (line,) = _cannot_start(logs[behaviour])
        assert str(dirs[behaviour] / PACKAGE) in line, line
        assert how in line and "during step 'load'" in line, line
        assert "package: serving" in logs[behaviour]  # chosen, then refused before serving
        assert "Traceback" not in logs[behaviour]

    assert embedding.shape == (2, 1536) and np.isfinite(embedding).all()
    assert Path(config["checkpoint"]).name == "b-portable.pt2"
    rejected = {r["file"]: r["mismatch"] for r in config["package_choice"]["rejected"]}
    assert rejected["a-native.pt2"].startswith("failed its load probe: load probe: loading package")
    assert "signal SIGBUS" in rejected["a-native.pt2"]
    assert (
        "package: a-native.pt2 failed its load probe; serving the next fitting package of its "
        "model, b-portable.pt2, instead" in set_log
    )
    assert "load probe: b-portable.pt2 loads and runs in a fresh process" in set_log
