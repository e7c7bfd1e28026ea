"""Fixtures for the chart, manifests and Dockerfile tests (helpers in helpers.py).

The real ``helm`` binary (``.tools/bin/helm`` under the repository root, else
``helm`` on PATH), no cluster; KServe CRD schemas from ``../shared/kserve-crds``
or ``$HISTOSERVE_KSERVE_CRDS``. A missing prerequisite fails the test with a
clear message when ``CI=true`` and skips it with the reason elsewhere.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from tests.chart.helpers import (
    CRD_FILES,
    K8S_VERSIONS,
    MONITOR_SCHEMAS,
    HelmError,
    check_metadata,
    crd_dir_path,
    find_helm,
    helm_template,
    k8s_validate,
    load_yaml,
    missing,
    parse_docs,
    strict_crd_schema,
    template_key,
)


@pytest.fixture(scope="session")
def helm_bin() -> str:
    helm = find_helm()
    if helm is None:
        missing("helm not found (.tools/bin/helm or PATH): run `make helm`")
    return helm


@pytest.fixture(scope="session")
def render(helm_bin: str) -> Callable[..., list[dict]]:
    """render(values=[ci file names], set_json={path: value}, ...) -> objects."""

    def _render(**kwargs: Any) -> list[dict]:
        return parse_docs(helm_template(helm_bin, template_key(**kwargs)))

    return _render


@pytest.fixture(scope="session")
def render_error(helm_bin: str) -> Callable[..., str]:
    """Renders values that must be refused; returns helm's error text."""

    def _render_error(**kwargs: Any) -> str:
        try:
            helm_template(helm_bin, template_key(**kwargs))
        except HelmError as exc:
            return exc.stderr
        raise AssertionError(f"helm template accepted values that must be refused: {kwargs}")

    return _render_error


@pytest.fixture(scope="session")
def crd_validators() -> dict[str, jsonschema.Draft7Validator]:
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


@pytest.fixture(scope="session")
def validate_object(crd_validators) -> Callable[[dict], None]:
    """Validates one rendered object against its schema; raises on any problem."""

    def _validate(obj: dict) -> None:
        kind = obj.get("kind")
        assert kind and obj.get("apiVersion"), f"object without kind/apiVersion: {obj}"
        check_metadata(obj)
        if kind in crd_validators:
            api_version, scope, validator = crd_validators[kind]
            assert obj["apiVersion"] == api_version, f"{kind}: apiVersion {obj['apiVersion']}"
            if scope == "Cluster":
                assert "namespace" not in obj["metadata"], f"cluster-scoped {kind} has a namespace"
            errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
            assert not errors, (
                f"{kind} {obj['metadata']['name']} fails its CRD schema:\n"
                + "\n".join(
                    f"  {'.'.join(map(str, e.absolute_path))}: {e.message[:300]}"
                    for e in errors[:10]
                )
            )
            return
        if kind in MONITOR_SCHEMAS:
            errors = list(MONITOR_SCHEMAS[kind].iter_errors(obj))
            assert not errors, f"{kind}: " + "; ".join(e.message for e in errors[:5])
            return
        for version in K8S_VERSIONS:
            k8s_validate(obj, version)

    return _validate
