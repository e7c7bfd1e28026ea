"""Validating one rendered object, as the chart tests and the docs checks both do.

:func:`load_crd_validators` builds strict validators for the KServe kinds from
the CRD folder once per session; :func:`check_object` picks the right schema
for an object (those validators, the Prometheus Operator monitors' structural
schemas, else Kubernetes' own in strict mode, at the oldest and newest
supported versions). Used by ``tests/chart/conftest.py`` (the
``validate_object`` fixture) and ``tests/integration/docs_checks.py`` (every
``helm install`` of the docs, rendered); the schemas themselves live in
:mod:`tests.chart.helpers`.
"""

from __future__ import annotations

import copy

import jsonschema

from tests.chart.helpers import (
    CRD_FILES,
    K8S_VERSIONS,
    MONITOR_SCHEMAS,
    check_metadata,
    crd_dir_path,
    k8s_validate,
    load_yaml,
    missing,
    strict_crd_schema,
)


def load_crd_validators() -> dict[str, tuple[str, str, jsonschema.Draft7Validator]]:
    """``{kind: (apiVersion, scope, strict validator)}`` for the KServe kinds, from the CRD folder.

    A missing folder or file fails in CI and skips elsewhere (:func:`missing`).
    """
    directory = crd_dir_path()
    if not directory.is_dir():
        missing(
            f"KServe CRD schemas not found at {directory} "
            "(set HISTOSERVE_KSERVE_CRDS to the folder holding serving.kserve.io_*.yaml)"
        )
    validators = {}
    for kind, name in CRD_FILES.items():
        path = directory / name
        if not path.exists():
            missing(f"KServe CRD file {path} missing")
        crd = load_yaml(path.read_text())
        (version,) = [v for v in crd["spec"]["versions"] if v.get("served", True)][:1]
        schema = strict_crd_schema(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
        validators[kind] = (
            f"{crd['spec']['group']}/{version['name']}",
            crd["spec"]["scope"],
            jsonschema.Draft7Validator(schema),
        )
    return validators


def check_object(obj: dict, crd_validators: dict) -> None:
    """Validates one rendered object against its schema (:func:`load_crd_validators`' for KServe
    kinds, a structural one for Prometheus Operator monitors, Kubernetes' strict one else)."""
    kind = obj.get("kind")
    assert kind and obj.get("apiVersion"), f"object without kind/apiVersion: {obj}"
    check_metadata(obj)
    if kind in crd_validators:
        api_version, scope, validator = crd_validators[kind]
        assert obj["apiVersion"] == api_version, f"{kind}: apiVersion {obj['apiVersion']}"
        if scope == "Cluster":
            assert "namespace" not in obj["metadata"], f"cluster-scoped {kind} has a namespace"
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        lines = [f"  {'.'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors]
        assert not errors, f"{kind} {obj['metadata']['name']} fails its CRD schema:\n" + "\n".join(
            lines[:10]
        )
        return
    if kind in MONITOR_SCHEMAS:
        errors = list(MONITOR_SCHEMAS[kind].iter_errors(obj))
        assert not errors, f"{kind}: " + "; ".join(e.message for e in errors[:5])
        return
    for version in K8S_VERSIONS:
        k8s_validate(obj, version)
