"""helm lint --strict and helm template over the ci/ values matrix; every object validated."""

from __future__ import annotations

import subprocess

import pytest

from tests.chart.helpers import (
    CHART,
    CI_VALUES,
    MONITORING_API,
    by_kind,
    ci_values_files,
    one,
    preset_files,
)

MATRIX = ci_values_files() + preset_files()
# A preset that scales out is installed with a claim every node can mount (as the
# docs do): the chart refuses its own ReadWriteOnce PVC with maxReplicas > 1.
PRESET_STORAGE = {"storage.pvc.existingClaim": "histo-models"}


def _sets(values: str | None) -> dict:
    return PRESET_STORAGE if values and "/presets/" in values else {}


# The matrix the issue asks for must stay covered (renaming a file must not drop a case).
REQUIRED_CASES = {
    "standard-keda-gpu-values.yaml",
    "standard-keda-queue-depth-values.yaml",
    "standard-hpa-values.yaml",
    "knative-kpa-scale-to-zero-values.yaml",
    "storage-uri-values.yaml",
    "pvc-created-values.yaml",
    "batcher-values.yaml",
}


def test_matrix_covers_required_cases():
    assert set(MATRIX) >= REQUIRED_CASES, sorted(REQUIRED_CASES - set(MATRIX))


def lint(helm_bin: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [helm_bin, "lint", "--strict", str(CHART), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_lint_strict_defaults(helm_bin):
    proc = lint(helm_bin)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("values", MATRIX)
def test_lint_strict_ci_values(helm_bin, values):
    path = str(CI_VALUES / values) if "/" not in values else values
    sets = [f"--set={k}={v}" for k, v in _sets(values).items()]
    proc = lint(helm_bin, "--values", path, *sets)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("values", [None, *MATRIX])
def test_every_rendered_object_validates(render, validate_object, values):
    objs = render(
        values=[values] if values else [], set_json=_sets(values), api_versions=[MONITORING_API]
    )
    kinds = [o["kind"] for o in objs]
    assert kinds.count("InferenceService") == 1, kinds
    for obj in objs:
        validate_object(obj)


@pytest.mark.parametrize("values", [None, *MATRIX])
def test_predictor_pod_is_consistent(render, values):
    """What the CRD schema cannot see: mounts name existing volumes, port names are legal."""
    objs = render(
        values=[values] if values else [], set_json=_sets(values), api_versions=[MONITORING_API]
    )
    pred = one(objs, "InferenceService")["spec"]["predictor"]
    volumes = {v["name"] for v in pred.get("volumes", [])}
    runtimes = by_kind(objs, "ClusterServingRuntime") + by_kind(objs, "ServingRuntime")
    for rt in runtimes:
        volumes |= {v["name"] for v in rt["spec"].get("volumes", [])}
    containers = list(pred.get("containers", []))
    if "model" in pred:
        containers.append(pred["model"])
    for rt in runtimes:
        containers += rt["spec"]["containers"]
    assert containers
    for c in containers:
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes, f"volumeMount {m['name']} has no volume ({volumes})"
        names = [p["name"] for p in c.get("ports", [])]
        assert len(names) == len(set(names)), names
        for n in names:
            assert len(n) <= 15 and n.islower(), f"port name {n!r} is not an IANA_SVC_NAME"
        mount_paths = [m["mountPath"] for m in c.get("volumeMounts", [])]
        assert len(mount_paths) == len(set(mount_paths)), mount_paths


@pytest.mark.parametrize("values", [None, *MATRIX])
def test_selectors_match_predictor_pods(render, values):
    """PDB, NetworkPolicy and monitors select the labels KServe puts on predictor pods."""
    objs = render(
        values=[values] if values else [], set_json=_sets(values), api_versions=[MONITORING_API]
    )
    isvc = one(objs, "InferenceService")
    kserve_pod_labels = {
        "serving.kserve.io/inferenceservice": isvc["metadata"]["name"],
        "component": "predictor",
    }
    selectors = [o["spec"]["selector"]["matchLabels"] for o in by_kind(objs, "PodDisruptionBudget")]
    selectors += [o["spec"]["podSelector"]["matchLabels"] for o in by_kind(objs, "NetworkPolicy")]
    selectors += [o["spec"]["selector"]["matchLabels"] for o in by_kind(objs, "PodMonitor")]
    selectors += [o["spec"]["selector"]["matchLabels"] for o in by_kind(objs, "ServiceMonitor")]
    for sel in selectors:
        assert sel.items() <= kserve_pod_labels.items(), sel


# ------------------------------------------------- the validators are not vacuous


def _refused(validate_object, obj):
    with pytest.raises(AssertionError):
        validate_object(obj)


def test_crd_validation_rejects_unknown_and_mistyped_fields(render, validate_object):
    import copy

    isvc = one(render(), "InferenceService")
    validate_object(isvc)
    bad = copy.deepcopy(isvc)
    bad["spec"]["predictor"]["replicas"] = 2  # not a predictor field
    _refused(validate_object, bad)
    bad = copy.deepcopy(isvc)
    bad["spec"]["predictor"]["containers"][0]["volumeMount"] = []  # typo deep in the PodSpec
    _refused(validate_object, bad)
    bad = copy.deepcopy(isvc)
    bad["spec"]["predictor"]["minReplicas"] = "1"
    _refused(validate_object, bad)
    # int-or-string fields take both
    ok = copy.deepcopy(isvc)
    ok["spec"]["predictor"]["deploymentStrategy"] = {
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}
    }
    validate_object(ok)


def test_core_validation_rejects_unknown_fields_and_bad_labels(render, validate_object):
    import copy

    pvc = one(render(), "PersistentVolumeClaim")
    bad = copy.deepcopy(pvc)
    bad["spec"]["size"] = "1Gi"
    _refused(validate_object, bad)
    bad = copy.deepcopy(pvc)
    bad["metadata"]["labels"]["app.kubernetes.io/version"] = "x" * 64
    _refused(validate_object, bad)


def test_missing_prerequisites_fail_in_ci_and_skip_elsewhere(monkeypatch, tmp_path):
    from tests.chart import helpers

    monkeypatch.setenv("HISTOSERVE_KSERVE_CRDS", str(tmp_path / "absent"))
    assert helpers.crd_dir_path() == tmp_path / "absent"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        helpers.missing("KServe CRD schemas not found")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="KServe CRD schemas not found"):
        helpers.missing("KServe CRD schemas not found")
