"""Package sets against real servers on loopback: the fitting build served and said so.

- A folder with three builds (native, x86-64-v3, a GPU-claiming copy: see
  :func:`harness.package_sets.three_builds`) serves the native one; the log,
  ``/v2/models/{name}/config`` and every answer's ``package_sha256`` say which.
- A folder where nothing fits is exit 2 naming each candidate's mismatch, the
  missing build key and the command that makes it.
- Two replicas started together on one volume holding only weights (what the
  chart's init container, ``histoserve export --package_set --if_missing``,
  then the server, do in each pod): one export, both serve the same package.
- An export killed mid-way (SIGKILL) leaves nothing a server takes; the next
  start exports a good package and serves it.
- Packages that lie about their build (a recorded key their own facts
  contradict; two packages of one key that differ in bytes) or whose metadata
  is mistyped are each named; in a set the honest package serves, and its
  ``/config`` key and weights digest are one fact.

The last two export for real (no cache can stand in: the export is the
subject), so they are ``slow`` (``make test-long``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness.package_sets import (
    claim,
    export_argv,
    fake_gpu_package,
    lie,
    rewrite_metadata,
    three_builds,
    write_weights,
)
from harness.server import REPO, Server, free_port, predictor_command, spawn, start_server
from harness.tiles import random_tiles

pytestmark = pytest.mark.integration

REPLICA_READY_S = 300.0


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _config(server: Server) -> dict:
    return httpx.get(f"{server.base}/v2/models/{server.model_name}/config", timeout=10).json()


def _embed(server: Server, tiles: np.ndarray) -> tuple[np.ndarray, str]:
    body = {
        "inputs": [
            {"name": "pixels", "datatype": "UINT8", "shape": list(tiles.shape),
             "data": tiles.ravel().tolist()}
        ]
    }  # fmt: skip
    url = f"{server.base}/v2/models/{server.model_name}/infer"
    answer = httpx.post(url, json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    out = answer.json()
    (embedding,) = [o for o in out["outputs"] if o["name"] == "embedding"]
    values = np.asarray(embedding["data"], dtype=np.float32).reshape(embedding["shape"])
    return values, out["parameters"]["package_sha256"]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return three_builds(tmp_path_factory.mktemp("three-builds"))


@pytest.fixture(scope="module")
def set_server(
    builds: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    server = start_server(
        builds["native"].parent, tmp_path_factory.mktemp("set-server"), "--max_batch_size", "8"
    )
    yield server
    server.stop()


def test_three_builds_serve_the_native_one_and_say_why(
    set_server: Server, builds: dict[str, Path]
) -> None:
    native, v3, gpu = (builds[k].name for k in ("native", "v3", "gpu"))
    config = _config(set_server)
    assert Path(config["checkpoint"]).name == native
    assert config["build_key"]["name"] == builds["native"].stem
    assert config["build_key"]["target"].startswith("native-")
    assert config["weights_sha256"] is None  # seeded demo weights: named by their source
    choice = config["package_choice"]
    assert choice["chosen"] == native
    assert "2 of 3 fit" in choice["reason"]
    mismatches = {r["file"]: r["mismatch"] for r in choice["rejected"]}
    assert mismatches[v3] == f"fits, ranked below {native}"
    assert mismatches[gpu].startswith("package was built for cuda but the server runs on cpu")
    _, digest = _embed(set_server, random_tiles(2, seed=3))
    assert digest == config["package_sha256"] == _sha256(builds["native"])
    log = set_server.log()
    assert f"package: serving {native} ({builds['native'].stem})" in log
    assert f"not taken: {v3}: fits, ranked below {native}; {gpu}: package was built for cuda" in log


@pytest.mark.parametrize("capabilities", [("90", "80"), ("90",)], ids=["set", "one-package"])
def test_nothing_fitting_is_exit_2_naming_each_candidate(
    builds: dict[str, Path], tmp_path: Path, capabilities: tuple[str, ...]
) -> None:
    for capability in capabilities:
        fake_gpu_package(builds["v3"], tmp_path, capability=capability)
    ports = (free_port(), free_port())
    command = predictor_command(tmp_path, ports, "--device", "cpu", "--max_batch_size", "8")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("histoserve: cannot start")]
    names = sorted(p.name for p in tmp_path.glob("*.pt2"))
    if len(names) > 1:  # a set: the rule names each candidate
        assert f"no package in {tmp_path} fits this host (cpu " in line
        for name in names:
            assert f"{name}: package was built for cuda but the server runs on cpu" in line
    else:  # one package: taken as always, refused by its host check at load
        assert "package was built for cuda but the server runs on cpu" in line
    assert "missing build key h0-mini_demo-tiny_fp32_b1-8_torch" in line
    assert "histoserve export --spec h0-mini --demo --demo_preset tiny" in line
    assert f"--device cpu --package_set {tmp_path}" in line


# -- replicas that build what is missing -------------------------------------------------------
def _replica(volume: Path, weights: Path, log_dir: Path, name: str) -> Server:
    """One pod: the init step (export if missing), then the server, on loopback."""
    ports = (free_port(), free_port())
    export = [sys.executable, "-m", "predictor.export", *export_argv(volume, weights)]
    serve = predictor_command(volume, ports, "--device", "cpu", "--max_batch_size", "8",
                              "--preprocess_workers", "2")  # fmt: skip
    script = f"{shlex.join(export)} && exec {shlex.join(serve)}"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return spawn(["sh", "-c", script], ports=ports, log_dir=log_dir, env=env, kind=name)


@pytest.mark.slow  # one real export (20-60 s on 2 busy cores) and two servers
def test_two_replicas_on_weights_alone_export_once_and_serve_the_same_package(
    tmp_path: Path,
) -> None:
    volume = tmp_path / "volume"
    weights = write_weights(volume / "encoder.pt")
    replicas = [_replica(volume, weights, tmp_path / "logs", f"replica{i}") for i in (0, 1)]
    try:
        for replica in replicas:
            replica.wait_ready(REPLICA_READY_S)
        (package,) = volume.glob("*.pt2")
        logs = [r.log() for r in replicas]
        assert sum(f"{package.name}: exported\n" in log for log in logs) == 1, logs
        assert all(
            "exported by another exporter; taken" in log or "nothing to export" in log
            for log in logs
            if f"{package.name}: exported\n" not in log
        )
        tiles = random_tiles(3, seed=11)
        answers = [_embed(r, tiles) for r in replicas]
        assert answers[0][1] == answers[1][1] == _sha256(package)
        np.testing.assert_array_equal(answers[0][0], answers[1][0])
        configs = [_config(r) for r in replicas]
        assert {c["weights_sha256"] for c in configs} == {_sha256(weights)}
        assert configs[0]["build_key"] == configs[1]["build_key"]
        assert configs[0]["build_key"]["name"] == package.stem
    finally:
        for replica in replicas:
            replica.stop()


@pytest.mark.slow  # an export killed mid-way, then a full one
def test_a_killed_export_is_never_served_and_the_next_start_builds_a_good_one(
    tmp_path: Path,
) -> None:
    volume = tmp_path / "volume"
    weights = write_weights(volume / "encoder.pt")
    argv = [sys.executable, "-m", "predictor.export", *export_argv(volume, weights)]
    with (tmp_path / "killed.log").open("wb") as log:
        exporter = subprocess.Popen(
            argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and exporter.poll() is None:
        if any(p.name.startswith(".export-") for p in volume.iterdir()):
            break  # compiling into its staging folder
        time.sleep(0.1)
    time.sleep(1.0)
    assert exporter.poll() is None, (tmp_path / "killed.log").read_text()
    os.killpg(exporter.pid, signal.SIGKILL)  # the exporter and its compiler children
    exporter.wait(30)
    assert not list(volume.glob("*.pt2"))
    leftovers = [p.name for p in volume.iterdir() if p.name.startswith(".export-")]
    replica = _replica(volume, weights, tmp_path / "logs", "restart")
    try:
        replica.wait_ready(REPLICA_READY_S)
        (package,) = volume.glob("*.pt2")
        assert f"{package.name}: exported\n" in replica.log()  # the dead holder's lock was freed
        _, digest = _embed(replica, random_tiles(1, seed=5))
        assert digest == _sha256(package) == _config(replica)["package_sha256"]
        assert leftovers and not any((volume / name).exists() for name in leftovers)  # removed
    finally:
        replica.stop()


# -- packages that lie about their build, or whose metadata is mistyped ------------------
def _provenance_list(metadata: dict[str, str]) -> None:
    metadata["histoserve.provenance"] = json.dumps([json.loads(metadata["histoserve.provenance"])])


def _min_batch_one(metadata: dict[str, str]) -> None:
    prov = json.loads(metadata["histoserve.provenance"])
    metadata["histoserve.provenance"] = json.dumps({**prov, "min_batch": "one"})


def _deep_provenance(metadata: dict[str, str]) -> None:
    metadata["histoserve.provenance"] = "[" * 5000 + "]" * 5000


def test_lying_and_mistyped_packages_are_named_and_never_served(
    builds: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "record"))
    honest_weights, other_weights = "ab" * 32, "cd" * 32
    newer = "2030-01-01T00:00:00+00:00"
    v3 = builds["v3"]
    # a set: the honest build (of weights ab..), a newer liar whose key alone claims it is of
    # weights cd.., and three mistyped packages: the honest one serves
    in_set = tmp_path / "set"
    honest = rewrite_metadata(v3, in_set, lambda m: claim(m, weights=f"sha256:{honest_weights}"))
    rewrite_metadata(
        v3, in_set,
        lambda m: (claim(m, weights=f"sha256:{honest_weights}", created_utc=newer),
                   lie(m, weights=f"sha256:{other_weights}")),
        "liar.pt2",
    )  # fmt: skip
    for change in (_provenance_list, _min_batch_one, _deep_provenance):
        rewrite_metadata(v3, in_set, change, f"{change.__name__[1:]}.pt2")
    # refused outright: a lone liar (h1, bf16: it is h0-mini fp32), two packages of one build
    # that differ in bytes, a lone mistyped package
    lone_liar = rewrite_metadata(v3, tmp_path / "lone-liar", lambda m: lie(m, spec="h1", dtype="bf16"), "h1.pt2")  # fmt: skip
    twins = tmp_path / "twins"
    twin_a = rewrite_metadata(
        v3, twins, lambda m: claim(m, weights=f"sha256:{honest_weights}"), "a.pt2"
    )
    twin_b = rewrite_metadata(
        v3,
        twins,
        lambda m: claim(m, weights=f"sha256:{honest_weights}", created_utc=newer),
        "b.pt2",
    )
    lone_mistyped = rewrite_metadata(v3, tmp_path / "lone-mistyped", _min_batch_one, "m.pt2")
    refused = {}
    for name, folder in (("lone-liar", lone_liar.parent), ("twins", twins),
                         ("lone-mistyped", lone_mistyped.parent)):  # fmt: skip
        command = predictor_command(folder, (free_port(), free_port()), "--device", "cpu",
                                    "--max_batch_size", "8")  # fmt: skip
        refused[name] = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
    server = start_server(in_set, tmp_path / "log", "--max_batch_size", "8")
    try:
        config = _config(server)
        _, digest = _embed(server, random_tiles(2, seed=8))
    finally:
        server.stop()
    lines = {}
    for name, proc in refused.items():
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 2, (name, err[-3000:])
        assert "Traceback" not in err, (name, err[-3000:])
        (lines[name],) = [x for x in err.splitlines() if x.startswith("histoserve: cannot start")]

    assert Path(config["checkpoint"]).name == honest.name and digest == _sha256(honest)
    assert config["weights_sha256"] == honest_weights
    assert config["build_key"]["weights"] == f"sha256:{honest_weights}"  # the same fact, read once
    rejected = {r["file"]: r["mismatch"] for r in config["package_choice"]["rejected"]}
    assert rejected["liar.pt2"].startswith(
        f"lies about its build: weights 'sha256:{other_weights}'"
    )
    for name, needle in (
        ("provenance_list", "'histoserve.provenance' is a list, expected a JSON object"),
        ("min_batch_one", 'min_batch is "one", expected an integer >= 1'),
        ("deep_provenance", "'histoserve.provenance' is not valid JSON"),
    ):
        assert rejected[f"{name}.pt2"].startswith(f"unreadable: {in_set / name}.pt2: "), rejected
        assert needle in rejected[f"{name}.pt2"]

    assert f"package {lone_liar} lies about its build" in lines["lone-liar"]
    assert "spec 'h1' in its recorded build key but 'h0-mini'" in lines["lone-liar"]
    assert "dtype 'bf16' in its recorded build key but 'fp32'" in lines["lone-liar"]
    assert str(twin_a) in lines["twins"] and str(twin_b) in lines["twins"]
    assert "differ in bytes" in lines["twins"]
    assert str(lone_mistyped) in lines["lone-mistyped"]
    assert 'min_batch is "one", expected an integer >= 1' in lines["lone-mistyped"]
