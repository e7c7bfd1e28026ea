"""A cohort Job's scale-out and scale-in, simulated on loopback with real processes.

Two server replicas (the real ``python -m predictor`` on a tiny demo package)
stand behind a loopback stand-in for their Kubernetes Service
(:class:`harness.service.LoopbackService`: a TCP proxy that places each new
connection on a replica, round robin, skipping one that refuses connections). Three shard
processes run the pod command line of ``charts/histoserve-embed``, read from
``helm template`` (never a copy): the volume mount paths are mapped to local
folders, ``$(JOB_COMPLETION_INDEX)`` is expanded as the kubelet does, the
Service URL points at the proxy. One replica gets SIGTERM once its tile counter
shows it is serving, drains, exits, and is started again on the same port.

Checked: every slide embedded exactly once (``status.csv``, files, no leftovers),
coordinates exactly the tissue grid, features equal to the package run in this
process on tiles read independently with OpenSlide, both replicas served tiles
(the restarted one too, which only recycled keep-alive connections can reach
through the Service), and every shard exited 0.
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

from harness.reference import Reference, normalise_reference
from harness.server import Server, spawn, start_server
from harness.service import LoopbackService
from harness.slides import aperio_svs, expected_coords
from tests.chart.helpers import REPO, find_helm, missing, one, parse_docs

CHART = REPO / "charts" / "histoserve-embed"
SHARDS = 3
STEP = 448  # level-0 footprint of a 224 px tile at 0.5 um/px on a 0.25 um/px slide
RUN_TIMEOUT_S = 240.0
ANNOTATION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_TILES_OK = re.compile(r'^histoserve_tiles_total\{[^}]*outcome="ok"[^}]*\} ([0-9.e+]+)$', re.M)


# ----------------------------------------------------------------- the pod command


def render_job(helm: str, url: str) -> dict:
    """The Job ``helm template`` renders for a 3-shard cohort against ``url``."""
    cmd = [
        helm, "template", "cohort", str(CHART), "--namespace", "pathology",
        "--set", "slides.pvc.claimName=slides", "--set", "output.pvc.claimName=features",
        "--set", f"inferenceService.url={url}", "--set", f"completions={SHARDS}",
        "--set", f"parallelism={SHARDS}", "--set", "concurrency=4",
        "--set", "embed.batchSize=16", "--set-json", 'embed.extraArgs=["--recycle-s=1"]',
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return one(parse_docs(proc.stdout), "Job")


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion: defined names replaced, ``$$`` escapes, rest kept."""

    def repl(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR.sub(repl, text)


def pod_process(job: dict, index: int, volumes: dict[str, Path]) -> tuple[list[str], dict, Path]:
    """argv, environment and working directory of the pod of ``index``, run on this machine.

    ``volumes`` maps the pod's volume names to local folders; every in-pod path
    under a mount is rewritten to the local folder.
    """
    (c,) = job["spec"]["template"]["spec"]["containers"]
    mounts = sorted(c["volumeMounts"], key=lambda m: -len(m["mountPath"]))

    def local(value: str) -> str:
        for m in mounts:
            root = m["mountPath"].rstrip("/")
            if value == root or value.startswith(root + "/"):
                return str(volumes[m["name"]]) + value[len(root) :]
        return value

    env: dict[str, str] = {}
    for var in c["env"]:
        if "valueFrom" in var:
            assert var["valueFrom"] == {"fieldRef": {"fieldPath": ANNOTATION_INDEX}}, var
            env[var["name"]] = str(index)  # the Job controller's annotation on pod `index`
        else:
            env[var["name"]] = local(expand(var["value"], env))
    args = [expand(a, env) for a in c["args"]]
    args = [f"{a.split('=', 1)[0]}={local(a.split('=', 1)[1])}" if "=" in a else a for a in args]
    (command,) = c["command"]
    argv = [str(Path(sys.executable).with_name(command)), *args]
    return argv, {**os.environ, **env}, Path(local(c["workingDir"]))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """27 slide ids over nine real pyramidal .svs files with different tissue (~2,500 tiles).

    Each file is listed under three ids (``S00a``, ``S00b``, ``S00c``): three
    slides to embed for the cost of writing one. The manifest uses paths
    relative to its folder, as a manifest on the slides volume may.
    """
    root = tmp_path_factory.mktemp("cohort-slides")
    files = {}
    for i in range(9):
        w, h = 12 + i % 4, 6 + i % 3  # tissue box in tiles (72-120 per slide): slides differ
        box = (STEP * (1 + i % 3), STEP * (1 + i % 2), STEP * w, STEP * h)
        files[f"S{i:02d}"] = aperio_svs(
            root / f"S{i:02d}.svs", width=8960, height=4480, boxes=(box,)
        )
    slides = {f"{name}{copy}": s for name, s in files.items() for copy in "abc"}
    manifest = "slide_id,path\n" + "".join(f"{sid},{s.path.name}\n" for sid, s in slides.items())
    (root / "manifest.csv").write_text(manifest)  # the chart's default slides.manifestPath
    return {"root": root, "slides": slides}


def tiles_ok(server: Server) -> float:
    return sum(float(v) for v in _TILES_OK.findall(server.metrics()))


@contextlib.contextmanager
def shard_processes(job: dict, slides_dir: Path, out: Path, tmp: Path) -> Iterator[list]:
    procs = []
    try:
        for index in range(SHARDS):
            pod_tmp = tmp / f"pod-{index}-tmp"  # each pod's own emptyDir
            pod_tmp.mkdir()
            volumes = {"slides": slides_dir, "output": out, "tmp": pod_tmp}
            argv, env, cwd = pod_process(job, index, volumes)
            log = open(tmp / f"shard-{index}.log", "wb")  # noqa: SIM115 - the child's stdout
            procs.append((subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=log), log))
        yield [p for p, _ in procs]
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
            log.close()


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling another process's /metrics: there is no event to wait on


# ------------------------------------------------------------------------------- test


@pytest.mark.slow  # a cohort through two replicas, one restarted mid-run (about 50 s): `make test-long`
def test_cohort_job_survives_replica_restart(
    embedding_package_dir: Path, cohort: dict, tmp_path: Path
) -> None:
    helm = find_helm()
    if helm is None:
        missing("helm not found (.tools/bin/helm or PATH): run `make helm`")
    out = tmp_path / "features"
    out.mkdir()
    # One device worker each: the cohort must outlast replica A's restart, and two
    # workers per replica (the CPU default) finish it first on this machine.
    one_worker = ("--instances_per_device", "1")
    a = start_server(embedding_package_dir, tmp_path / "logs", *one_worker)
    b = start_server(embedding_package_dir, tmp_path / "logs", *one_worker)
    service = LoopbackService([a.http_port, b.http_port])
    job = render_job(helm, f"http://127.0.0.1:{service.port}")
    restarted: Server | None = None
    try:
        with shard_processes(job, cohort["root"], out, tmp_path) as shards:
            restarted = _restart_mid_run(a, shards, tmp_path)
            codes = [p.wait(RUN_TIMEOUT_S) for p in shards]
        logs = "\n".join((tmp_path / f"shard-{i}.log").read_text() for i in range(SHARDS))
        assert codes == [0] * SHARDS, f"shard exit codes {codes}:\n{logs[-4000:]}"
        served = {"b": tiles_ok(b), "a after restart": tiles_ok(restarted)}
        drained = a.log().count('HTTP/1.1" 503')  # answered while draining, retried elsewhere
        print(f"cohort: tiles {served}, connections {service.connections}, A's 503s {drained}")
        assert all(v > 0 for v in served.values()), (served, service.connections)
    finally:
        service.close()
        for server in (a, b, restarted):
            if server is not None:
                server.stop()
    _check_exactly_once(out, cohort["slides"])
    _check_correct(out, cohort["slides"], embedding_package_dir)


def _restart_mid_run(a: Server, shards: list, tmp_path: Path) -> Server:
    """SIGTERM replica A once it serves tiles; start it again on the same ports at once.

    The shards keep running on replica B meanwhile, their keep-alive connections
    busy there; when A is back, only connections the client recycles reach it.
    """
    wait_until(lambda: tiles_ok(a) > 0, 120.0, "replica A to serve tiles")
    assert a.stop() == 0, a.tail()
    assert any(p.poll() is None for p in shards), "the cohort finished before A stopped"
    again = spawn(
        a.args, ports=(a.http_port, a.grpc_port), log_dir=tmp_path / "logs",
        model_name=a.model_name, env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2"},
        kind="restarted",
    )  # fmt: skip
    again.wait_ready()
    left = [p for p in shards if p.poll() is None]
    assert left, "the cohort finished before replica A was back: the check needs more tiles"
    return again


def _check_exactly_once(out: Path, slides: dict) -> None:
    with open(out / "status.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    ids = sorted(r["slide_id"] for r in rows)
    assert ids == sorted(slides), f"status.csv rows: {ids}"
    bad = [r for r in rows if r["status"] != "done"]
    assert not bad, bad
    names = sorted(p.name for p in out.iterdir())
    listed = ("status.csv", ".claims", ".histoserve-run.json", "qc", "report.html")
    expected = [*(f"{s}.h5" for s in slides), *listed]
    assert names == sorted(expected), names
    qc = sorted(p.name for p in (out / "qc").iterdir())
    assert qc == sorted(f"{s}.{ext}" for s in slides for ext in ("jpg", "geojson", "json")), qc
    assert not list((out / ".claims").iterdir()), "claims left behind"
    for r in rows:
        with h5py.File(out / f"{r['slide_id']}.h5") as f:
            assert int(r["n_tiles"]) == len(f["features"]) == len(f["coords"])


def _check_correct(out: Path, slides: dict, package_dir: Path) -> None:
    """Exact tissue grid per slide; sampled features equal the package on OpenSlide reads."""
    import openslide

    reference = Reference(next(package_dir.glob("*.pt2")))
    rng = np.random.default_rng(11)
    for slide_id, slide in slides.items():
        with h5py.File(out / f"{slide_id}.h5") as f:
            coords, features = f["coords"][:], f["features"][:]
            assert f.attrs["slide_id"] == slide_id and int(f.attrs["read_level"]) == 1
        bounds = (0, 0, slide.spec.width, slide.spec.height)
        np.testing.assert_array_equal(coords, expected_coords(slide.boxes, STEP, bounds))
        rows = rng.choice(len(coords), size=3, replace=False)
        with contextlib.closing(openslide.OpenSlide(str(slide.path))) as osr:
            tiles = np.stack(
                [
                    np.asarray(osr.read_region(tuple(coords[r]), 1, (224, 224)).convert("RGB"))
                    for r in rows
                ]
            )
        (want,) = reference(normalise_reference(tiles))[:1]
        np.testing.assert_allclose(features[rows], want, rtol=1e-4, atol=1e-4, err_msg=slide_id)
