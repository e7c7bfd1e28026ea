"""values.schema.json: strict, and impossible combinations fail with a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.chart.helpers import CHART, CI_VALUES, ci_values_files, load_yaml, preset_files

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS = load_yaml((CHART / "values.yaml").read_text())


def test_schema_is_valid_draft7_and_accepts_defaults():
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator(SCHEMA).validate(DEFAULTS)


def _merge(base, override):
    out = dict(base)
    for k, v in override.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.mark.parametrize("values", ci_values_files() + preset_files())
def test_ci_values_validate_against_schema(values):
    merged = _merge(DEFAULTS, load_yaml((CI_VALUES / Path(values)).read_text()))
    jsonschema.Draft7Validator(SCHEMA).validate(merged)


def _every_object_schema_is_strict(node, path="$"):
    if not isinstance(node, dict):
        return
    if node.get("type") == "object" and "properties" in node:
        assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"
    for key, child in (node.get("properties") or {}).items():
        _every_object_schema_is_strict(child, f"{path}.{key}")


def test_schema_rejects_unknown_keys_everywhere():
    _every_object_schema_is_strict(SCHEMA)


def test_every_default_value_is_described_by_the_schema():
    def walk(values, schema, path):
        props = schema.get("properties", {})
        for key, value in values.items():
            assert key in props, f"{path}.{key} is in values.yaml but not in values.schema.json"
            if isinstance(value, dict) and "properties" in props[key]:
                walk(value, props[key], f"{path}.{key}")

    walk(DEFAULTS, SCHEMA, "")


# (values, text the error must contain): each is refused by `helm template`.
NEGATIVES = {
    "bad deploymentMode enum": (
        {"deploymentMode": "Serverless"},
        "/deploymentMode",
    ),
    "bad autoscaler class enum": (
        {"autoscaling": {"class": "vpa"}},
        "/autoscaling/class",
    ),
    "bad metric enum": (
        {"autoscaling": {"metric": "gpu"}},
        "/autoscaling/metric",
    ),
    "unknown top-level key": ({"replicaCount": 2}, "replicaCount"),
    "unknown nested key": ({"gpu": {"type": "a100"}}, "type"),
    "typo in storage": ({"storage": {"pvc": {"existingclaim": "x"}}}, "existingclaim"),
    "missing claim": (
        {"storage": {"pvc": {"create": False, "existingClaim": ""}}},
        "/storage/pvc/existingClaim",
    ),
    "storageUri and existingClaim both": (
        {"storage": {"storageUri": "s3://b/m", "pvc": {"existingClaim": "c"}}},
        "/storage/pvc/existingClaim",
    ),
    "bad storageUriMode": (
        {"storage": {"storageUriMode": "initContainer"}},
        "/storage/storageUriMode",
    ),
    "relative mountPath": ({"storage": {"mountPath": "models"}}, "/storage/mountPath"),
    "mountPath over the scratch dir": ({"storage": {"mountPath": "/tmp"}}, "/storage/mountPath"),
    "Knative with KEDA": (
        {"deploymentMode": "Knative", "autoscaling": {"class": "keda", "maxReplicas": 3}},
        "/autoscaling/class",
    ),
    "Knative with a cpu metric": (
        {"deploymentMode": "Knative", "autoscaling": {"metric": "cpu", "maxReplicas": 3}},
        "/autoscaling/metric",
    ),
    "Standard with KPA": (
        {"autoscaling": {"class": "kpa", "maxReplicas": 3}},
        "/autoscaling/class",
    ),
    "Standard with concurrency": (
        {"autoscaling": {"metric": "concurrency", "maxReplicas": 3}},
        "/autoscaling/metric",
    ),
    "scale to zero outside Knative": (
        {"autoscaling": {"minReplicas": 0, "maxReplicas": 3, "metric": "queue-depth"}},
        "/autoscaling/minReplicas",
    ),
    "HPA on queue depth": (
        {"autoscaling": {"class": "hpa", "metric": "queue-depth", "maxReplicas": 3}},
        "/autoscaling/metric",
    ),
    "KEDA on cpu": (
        {"autoscaling": {"class": "keda", "metric": "cpu", "maxReplicas": 3}},
        "/autoscaling/metric",
    ),
    "prometheus metric without a query": (
        {"autoscaling": {"metric": "prometheus", "maxReplicas": 3}},
        "/autoscaling/keda/query",
    ),
    "utilisation above 100": (
        {"autoscaling": {"metric": "cpu", "maxReplicas": 3, "target": 150}},
        "/autoscaling/target",
    ),
    "GPU metric without a GPU": (
        {"gpu": {"count": 0}, "autoscaling": {"metric": "gpu-utilization", "maxReplicas": 3}},
        "/autoscaling/metric",
    ),
    "negative GPU count": ({"gpu": {"count": -1}}, "/gpu/count"),
    "bad device": ({"model": {"device": "gpu"}}, "/model/device"),
    "model name with a slash": ({"model": {"name": "a/b"}}, "/model/name"),
    "bad image digest": ({"image": {"digest": "sha256:abc"}}, "/image/digest"),
    "bad pull policy": ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    "fullname too long": ({"fullnameOverride": "x" * 46}, "/fullnameOverride"),
    "ServiceMonitor in Knative": (
        {"deploymentMode": "Knative", "metrics": {"serviceMonitor": {"enabled": True}}},
        "/metrics/serviceMonitor/enabled",
    ),
    "ServiceMonitor behind the agent batcher": (
        {"kserveBatcher": {"enabled": True}, "metrics": {"serviceMonitor": {"enabled": True}}},
        "/kserveBatcher/enabled",
    ),
    "gRPC test with Knative on http": (
        {"deploymentMode": "Knative", "tests": {"protocol": "grpc"}},
        "/tests/protocol",
    ),
    "HTTP test with Knative on grpc": (
        {"deploymentMode": "Knative", "knative": {"protocol": "grpc"}},
        "/tests/protocol",
    ),
    "deploymentStrategy in Knative": (
        {"deploymentMode": "Knative", "deploymentStrategy": {"type": "Recreate"}},
        "/deploymentStrategy",
    ),
    "bad knative protocol": ({"knative": {"protocol": "h2"}}, "/knative/protocol"),
    "bad runtime kind": ({"servingRuntime": {"kind": "Runtime"}}, "/servingRuntime/kind"),
    "bad quantity": ({"shm": {"sizeLimit": "two gigs"}}, "/shm/sizeLimit"),
    "extra arg not a flag": ({"server": {"extraArgs": ["debug"]}}, "/server/extraArgs"),
    "model class not MODULE:CLASS": (
        {"model": {"modelClass": "my_models.Mine"}},
        "/model/modelClass",
    ),
}


@pytest.mark.parametrize("case", sorted(NEGATIVES))
def test_schema_negatives_fail_rendering(render_error, case):
    values, needle = NEGATIVES[case]
    flat = {}

    def flatten(prefix, node):
        for k, v in node.items():
            key = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict) and v:
                flatten(key, v)
            else:
                flat[key] = v

    flatten("", values)
    err = render_error(set_json=flat)
    assert "schema" in err, err
    assert needle in err, f"error does not point at {needle}:\n{err}"


# Checks the schema cannot express, made by the templates with a sentence.
TEMPLATE_FAILURES = {
    "min above max": (
        {"autoscaling.minReplicas": 4, "autoscaling.maxReplicas": 2},
        "autoscaling.minReplicas (4) must be <= autoscaling.maxReplicas (2)",
    ),
}


@pytest.mark.parametrize("case", sorted(TEMPLATE_FAILURES))
def test_template_checks_fail_with_a_sentence(render_error, case):
    values, sentence = TEMPLATE_FAILURES[case]
    assert sentence in render_error(set_json=values)
