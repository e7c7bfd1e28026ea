"""charts/histoserve-embed on a real cluster: Istio-injected namespaces and shared output volumes.

- An Istio classic sidecar keeps each pod Running after ``histoserve embed``
  exits, so the Job never completes: the pods opt out (or ask for a native
  sidecar, which stops with the pod).
- ``fsGroup`` is not applied to ReadWriteMany CSI volumes under the default
  ``fsGroupPolicy`` and NFS ignores it: the output folder's writability is
  checked by an init container as the pods' user, whose exit 2 fails the Job
  at once; its script is run here against a writable and an unwritable path.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.chart.cluster import istio_sidecar
from tests.chart.embed_helpers import CHART, container, pod_spec, render
from tests.chart.helpers import one

SETS = ('output.pvc.subPath="cohort-1"',)


def _job(helm_bin: str, *sets: str) -> dict:
    return one(render(helm_bin, None, *SETS, *sets), "Job")


@pytest.mark.parametrize("namespace_injects", [True, False])
def test_the_job_completes_in_an_istio_namespace(helm_bin, namespace_injects):
    template = _job(helm_bin)["spec"]["template"]
    assert istio_sidecar(template, namespace_injects) is None


def test_a_native_sidecar_when_the_mesh_is_needed(helm_bin):
    template = _job(helm_bin, 'istio.sidecar="native"')["spec"]["template"]
    assert istio_sidecar(template) == "native"


def _prepare(job: dict) -> dict:
    (init,) = [
        c
        for c in job["spec"]["template"]["spec"]["initContainers"]
        if c["name"] == "prepare-output"
    ]
    return init


def test_the_output_is_checked_writable_as_the_pods_user(helm_bin):
    objs = render(helm_bin, None, *SETS)
    job = one(objs, "Job")
    init, main = _prepare(job), container(objs)
    (out_mount,) = [m for m in main["volumeMounts"] if m["name"] == "output"]
    assert out_mount in init["volumeMounts"]  # same volume, same subPath
    assert init["securityContext"] == main["securityContext"]  # the same non-root user
    rules = job["spec"]["podFailurePolicy"]["rules"]
    fail_on_init = {
        "action": "FailJob",
        "onExitCodes": {"containerName": "prepare-output", "operator": "In", "values": [2]},
    }
    assert fail_on_init in rules


def _run_check(init: dict, path: Path) -> subprocess.CompletedProcess:
    command = init["command"]
    assert command[:2] == ["python", "-c"] and command[3] == "/output"
    return subprocess.run(
        [sys.executable, "-c", command[2], str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_check_passes_on_a_writable_folder_and_fails_fast_otherwise(helm_bin, tmp_path):
    init = _prepare(_job(helm_bin))
    assert _run_check(init, tmp_path).returncode == 0
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    proc = _run_check(init, not_a_folder)
    assert proc.returncode == 2
    assert "not writable by uid" in proc.stderr and "fsGroup" in proc.stderr


def test_chown_runs_as_root_with_chown_only(helm_bin):
    spec = _job(helm_bin, 'output.prepare="chown"')["spec"]["template"]["spec"]
    chown, check = spec["initContainers"]
    assert chown["command"] == ["chown", "10001:10001", "/output"]
    caps = chown["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert chown["securityContext"]["allowPrivilegeEscalation"] is False
    assert check["name"] == "prepare-output"


def test_none_leaves_no_init_container(helm_bin):
    assert "initContainers" not in pod_spec(render(helm_bin, None, 'output.prepare="none"'))


def test_the_docs_no_longer_promise_fsgroup_makes_it_writable():
    for name in ("README.md", "values.yaml"):
        assert "fsGroup makes the output" not in (CHART / name).read_text()
