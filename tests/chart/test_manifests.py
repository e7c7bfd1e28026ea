"""manifests/: generated from the chart, valid, and never stale."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.chart.helpers import REPO, args_of, by_kind, load_yaml, one, parse_docs

MANIFESTS = REPO / "manifests"
SCRIPT = REPO / "scripts" / "render_manifests.py"


def manifest_objects() -> list[dict]:
    objs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            objs += parse_docs(path.read_text())
    return objs


def test_manifests_match_a_fresh_render(helm_bin):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--helm", helm_bin, "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, (
        "manifests/ is stale: run `make manifests` and commit the result\n" + proc.stderr[-4000:]
    )


def test_render_script_detects_drift(helm_bin, tmp_path):
    out = tmp_path / "manifests"
    ok = subprocess.run(
        [sys.executable, str(SCRIPT), "--helm", helm_bin, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    isvc = out / "inference-service.yaml"
    isvc.write_text(isvc.read_text().replace("minReplicas: 1", "minReplicas: 2"))
    (out / "leftover.yaml").write_text("kind: ConfigMap\n")
    drift = subprocess.run(
        [sys.executable, str(SCRIPT), "--helm", helm_bin, "--out", str(out), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert drift.returncode == 1
    assert "minReplicas: 2" in drift.stderr and "leftover.yaml" in drift.stderr
    assert "make manifests" in drift.stderr


def test_kustomization_lists_every_manifest():
    kustomization = load_yaml((MANIFESTS / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_manifests_hold_runtime_isvc_pvc(validate_object):
    objs = manifest_objects()
    for obj in objs:
        validate_object(obj)
        labels = obj["metadata"].get("labels", {})
        assert "helm.sh/chart" not in labels, obj["kind"]
        assert labels.get("app.kubernetes.io/managed-by") != "Helm", obj["kind"]
        assert "namespace" not in obj["metadata"], f"{obj['kind']} pins a namespace"
    assert not by_kind(objs, "Pod"), "helm test objects leaked into manifests/"
    runtime = one(objs, "ClusterServingRuntime")
    spec = runtime["spec"]
    assert [f["name"] for f in spec["supportedModelFormats"]] == ["pt2"]
    assert set(spec["protocolVersions"]) == {"v1", "v2", "grpc-v2"}
    (container,) = spec["containers"]
    assert args_of(container)["model_name"] == "{{.Name}}"
    isvc = one(objs, "InferenceService")
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "pt2"
    assert model["runtime"] == runtime["metadata"]["name"]
    pvc = one(objs, "PersistentVolumeClaim")
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in isvc["spec"]["predictor"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == [pvc["metadata"]["name"]]
    sa = one(objs, "ServiceAccount")
    assert isvc["spec"]["predictor"]["serviceAccountName"] == sa["metadata"]["name"]


@pytest.mark.parametrize("name", ["source/values.yaml", "README.md"])
def test_manifests_sources_are_documented(name):
    text = (MANIFESTS / name).read_text()
    assert "make manifests" in text
