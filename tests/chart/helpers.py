"""Helpers for the chart, manifests and Dockerfile tests (fixtures live in conftest.py).

Everything here runs the real ``helm`` binary (``.tools/bin/helm`` under the
repository root, else ``helm`` on PATH; ``make helm`` installs it) with no
cluster, and holds the schemas every rendered object is validated against
(by :func:`tests.chart.validators.check_object`): KServe kinds against the CRD
schemas in ``../shared/kserve-crds`` (or ``$HISTOSERVE_KSERVE_CRDS``), core kinds
with ``kubernetes-validate`` in strict mode, Prometheus Operator kinds against a
structural schema of the fields the chart emits.

A missing prerequisite (helm, the CRD folder) fails the test with a clear
message when ``CI=true`` and skips it with the reason elsewhere.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "histoserve"
CI_VALUES = CHART / "ci"
RELEASE = "hs"
NAMESPACE = "histo"
FULLNAME = "hs-histoserve"
PREDICTOR = f"{FULLNAME}-predictor"
# Passed as --api-versions so the Prometheus Operator monitors render.
MONITORING_API = "monitoring.coreos.com/v1"

# Oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest
# kubernetes-validate ships: every core object must validate against both.
K8S_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())

CRD_FILES = {
    "InferenceService": "serving.kserve.io_inferenceservices.yaml",
    "ServingRuntime": "serving.kserve.io_servingruntimes.yaml",
    "ClusterServingRuntime": "serving.kserve.io_clusterservingruntimes.yaml",
}

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(reason: str) -> None:
    """Fails in CI (a silently skipped check is a passed check), skips elsewhere."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: this check must run)", pytrace=False)
    pytest.skip(reason)


# --------------------------------------------------------------------------- helm


def find_helm() -> str | None:
    local = REPO / ".tools" / "bin" / "helm"
    if local.exists() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("helm")


class HelmError(Exception):
    def __init__(self, args: list[str], stderr: str) -> None:
        super().__init__(stderr)
        self.args_ = args
        self.stderr = stderr


@functools.lru_cache(maxsize=256)
def helm_template(helm: str, key: tuple) -> str:
    values_files, sets, set_strings, api_versions, extra = key
    cmd = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for f in values_files:
        cmd += ["--values", str(f)]
    for s in sets:
        cmd += ["--set-json", s]
    for s in set_strings:
        cmd += ["--set-string", s]
    for a in api_versions:
        cmd += ["--api-versions", a]
    cmd += list(extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise HelmError(cmd, proc.stderr)
    return proc.stdout


def template_key(
    values: Iterable[str | Path] = (),
    set_json: dict[str, Any] | None = None,
    set_string: dict[str, str] | None = None,
    api_versions: Iterable[str] = (),
    extra: Iterable[str] = (),
) -> tuple:
    import json

    files = tuple(str(CI_VALUES / v) if not Path(v).is_absolute() else str(v) for v in values)
    sets = tuple(f"{k}={json.dumps(v)}" for k, v in sorted((set_json or {}).items()))
    strings = tuple(f"{k}={v}" for k, v in sorted((set_string or {}).items()))
    return (files, sets, strings, tuple(api_versions), tuple(extra))


def helm_notes(helm: str, chart: Path, release: str, namespace: str, *args: str) -> str:
    """The NOTES.txt ``helm install --dry-run=client`` prints for ``chart`` (no cluster needed)."""
    proc = subprocess.run(
        [helm, "install", release, str(chart), "--namespace", namespace, "--dry-run=client", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"KUBECONFIG": "/nonexistent", "PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:", 1)[1]


def leaf_paths(node: dict, passthrough: Iterable[str], prefix: str = "") -> Iterator[str]:
    """Dotted paths of a values tree's leaves; ``passthrough`` paths count as one leaf each."""
    passthrough = frozenset(passthrough)
    for key, value in node.items():
        path = f"{prefix}{key}"
        if path in passthrough or not (isinstance(value, dict) and value):
            yield path
        else:
            yield from leaf_paths(value, passthrough, f"{path}.")


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def parse_docs(text: str) -> list[dict]:
    return [d for d in yaml.load_all(text, Loader=_Loader) if d]


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o.get("kind") == kind]


def one(objs: list[dict], kind: str) -> dict:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}: {[o['kind'] for o in objs]}"
    return found[0]


def isvc_container(objs: list[dict]) -> dict:
    """The kserve-container spec: custom container or the runtime-based model spec."""
    pred = one(objs, "InferenceService")["spec"]["predictor"]
    if "containers" in pred:
        (container,) = [c for c in pred["containers"] if c["name"] == "kserve-container"]
        return container
    return pred["model"]


def args_of(container: dict) -> dict[str, str]:
    """--flag=value args as a dict (last occurrence wins, as with argparse)."""
    out: dict[str, str] = {}
    for arg in container.get("args", []):
        if arg.startswith("--") and "=" in arg:
            k, v = arg[2:].split("=", 1)
            out[k] = v
    return out


# --------------------------------------------------------------------------- CRDs


def crd_dir_path() -> Path:
    env = os.environ.get("HISTOSERVE_KSERVE_CRDS")
    return Path(env) if env else REPO.parent / "shared" / "kserve-crds"


def strict_crd_schema(schema: Any) -> Any:
    """CRD openAPIV3Schema -> JSON Schema with the API server's strictness.

    x-kubernetes-int-or-string: integer or string. x-kubernetes-preserve-unknown-fields:
    unknown keys allowed. Elsewhere an object with properties rejects unknown keys
    (strict field validation).
    """
    if not isinstance(schema, dict):
        return schema
    node = dict(schema)
    if "properties" in node:
        node["properties"] = {k: strict_crd_schema(v) for k, v in node["properties"].items()}
    for key in ("items", "not"):
        if isinstance(node.get(key), dict):
            node[key] = strict_crd_schema(node[key])
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = strict_crd_schema(node["additionalProperties"])
    for key in ("anyOf", "allOf", "oneOf"):
        if isinstance(node.get(key), list):
            node[key] = [strict_crd_schema(s) for s in node[key]]
    if node.get("x-kubernetes-int-or-string"):
        node.pop("type", None)
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        node["additionalProperties"] = False
    return node


# ----------------------------------------------------- Prometheus Operator (structure)

_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string", "minLength": 1},
        "path": {"type": "string", "pattern": "^/"},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
        "relabelings": {"type": "array", "items": {"type": "object"}},
        "metricRelabelings": {"type": "array", "items": {"type": "object"}},
    },
    "required": ["port"],
}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
}


def _monitor_schema(endpoints_key: str) -> dict:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector", endpoints_key],
                "properties": {
                    "selector": _LABEL_SELECTOR,
                    "namespaceSelector": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "any": {"type": "boolean"},
                            "matchNames": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    endpoints_key: {"type": "array", "minItems": 1, "items": _ENDPOINT},
                },
            },
        },
    }


MONITOR_SCHEMAS = {
    "PodMonitor": jsonschema.Draft7Validator(_monitor_schema("podMetricsEndpoints")),
    "ServiceMonitor": jsonschema.Draft7Validator(_monitor_schema("endpoints")),
}

# ----------------------------------------------------------------------- metadata

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?)$")


def _check_key(key: str, what: str) -> None:
    prefix, _, name = key.rpartition("/")
    assert _LABEL_NAME.match(name) and len(name) <= 63, f"{what} key {key!r} is invalid"
    if prefix:
        assert _DNS1123_SUBDOMAIN.match(prefix) and len(prefix) <= 253, (
            f"{what} key prefix {prefix!r} is invalid"
        )


def check_metadata(obj: dict) -> None:
    meta = obj["metadata"]
    name = meta["name"]
    assert _DNS1123_SUBDOMAIN.match(name) and len(name) <= 253, f"invalid name {name!r}"
    for key, value in (meta.get("labels") or {}).items():
        _check_key(key, "label")
        assert isinstance(value, str), f"label {key} value must be a string, got {value!r}"
        assert _LABEL_VALUE.match(value) and len(value) <= 63, f"label {key}={value!r} is invalid"
    for key, value in (meta.get("annotations") or {}).items():
        _check_key(key, "annotation")
        assert isinstance(value, str), f"annotation {key} value must be a string, got {value!r}"
    # ObjectMeta's own schema (field names and types) through a carrier kind.
    carrier = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
    k8s_validate(carrier, K8S_VERSIONS[-1])


@functools.lru_cache(maxsize=128)
def _k8s_validator(kind: str, api_version: str, version: str) -> Any:
    """kubernetes-validate's strict schema for kind, built once (it re-reads files per call)."""
    import referencing
    import referencing.jsonschema
    from kubernetes_validate import utils

    versions = [v for v in utils.all_versions() if utils.major_minor(v) <= version]
    schema_dir = f"v{versions[-1]}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = utils.schema_contents(
            f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group_version}.json", version
        )
    except FileNotFoundError:
        raise AssertionError(f"no Kubernetes {version} schema for {api_version} {kind}") from None
    definitions = utils.schema_contents(
        f"kubernetes-json-schema/{schema_dir}/_definitions.json", version
    )
    registry = referencing.Resource.from_contents(schema) @ referencing.Registry()
    registry = referencing.Resource.from_contents(definitions) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


def k8s_validate(obj: dict, version: str) -> None:
    """Strict validation of a core object against Kubernetes version's schema."""
    validator = _k8s_validator(obj["kind"], obj["apiVersion"], version)
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = ".".join(str(p) for p in e.absolute_path)
        raise AssertionError(
            f"{obj['kind']} {obj['metadata'].get('name')} fails Kubernetes {version} (strict): "
            f"{path}: {e.message[:300]}"
        )


def ci_values_files() -> list[str]:
    return sorted(p.name for p in CI_VALUES.glob("*.yaml"))


def preset_files() -> list[str]:
    """The documented presets (absolute paths: template_key keeps them as they are)."""
    return sorted(str(p) for p in (CHART / "presets").glob("*.yaml"))
