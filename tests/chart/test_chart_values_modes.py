"""Value by value: deployment modes and autoscaling (Standard, Knative, KPA, HPA, KEDA).

Each value changes what it should in the rendered objects.
"""

from __future__ import annotations

import pytest

from tests.chart.helpers import (
    NAMESPACE,
    PREDICTOR,
    isvc_container,
    one,
)
from tests.chart.rendered import isvc, pred

# Several replicas need a claim several nodes can mount (the chart refuses its own
# ReadWriteOnce PVC with maxReplicas > 1).
SHARED = {"storage.pvc.existingClaim": "histo-models"}

# ------------------------------------------------------------ deployment modes


def test_standard_mode(render):
    objs = render()
    ann = isvc(objs)["metadata"]["annotations"]
    assert ann["serving.kserve.io/deploymentMode"] == "Standard"
    assert "serving.knative.dev/progress-deadline" not in pred(objs).get("annotations", {})


def test_knative_mode_one_http_port_and_progress_deadline(render):
    objs = render(values=["knative-kpa-scale-to-zero-values.yaml"])
    ann = isvc(objs)["metadata"]["annotations"]
    assert ann["serving.kserve.io/deploymentMode"] == "Knative"
    assert "serving.kserve.io/autoscalerClass" not in ann  # KPA: KServe rejects "kpa" there
    c = isvc_container(objs)
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("http1", 8080)]
    pod_ann = pred(objs)["annotations"]
    assert pod_ann["serving.knative.dev/progress-deadline"] == "2400s"
    assert pod_ann["autoscaling.knative.dev/scale-down-delay"] == "10m"
    assert pod_ann["autoscaling.knative.dev/window"] == "120s"
    assert pred(objs)["timeout"] == 300


@pytest.mark.parametrize(
    "values", ["knative-kpa-scale-to-zero-values.yaml", "knative-grpc-values.yaml"]
)
def test_knative_mode_omits_what_knative_rejects(render, values):
    """Knative's webhook refuses lifecycle hooks, terminationGracePeriodSeconds and
    pod securityContext fields beyond its allow-list (fsGroupChangePolicy...)."""
    objs = render(values=[values])
    p = pred(objs)
    assert "terminationGracePeriodSeconds" not in p
    assert "lifecycle" not in isvc_container(objs)
    assert set(p["securityContext"]) <= {
        "runAsUser",
        "runAsGroup",
        "runAsNonRoot",
        "fsGroup",
        "supplementalGroups",
        "seccompProfile",
    }
    assert p["securityContext"]["runAsNonRoot"] is True and p["securityContext"]["fsGroup"] == 10001
    allowed_container = {
        "name", "args", "command", "env", "workingDir", "envFrom", "image", "imagePullPolicy",
        "livenessProbe", "ports", "readinessProbe", "resources", "securityContext", "startupProbe",
        "terminationMessagePath", "terminationMessagePolicy", "volumeMounts",
    }  # fmt: skip
    assert set(isvc_container(objs)) <= allowed_container


def test_runtime_has_no_lifecycle_but_standard_isvc_adds_it(render):
    objs = render(values=["serving-runtime-values.yaml"])
    (c,) = one(objs, "ClusterServingRuntime")["spec"]["containers"]
    assert "lifecycle" not in c
    assert pred(objs)["model"]["lifecycle"]["preStop"]["sleep"]["seconds"] == 5


def test_knative_grpc_exposes_only_h2c(render):
    objs = render(values=["knative-grpc-values.yaml"])
    c = isvc_container(objs)
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("h2c", 8081)]
    # probes stay on the HTTP port, which the server still listens on
    assert c["readinessProbe"]["httpGet"]["port"] == 8080


def test_knative_initial_scale(render):
    objs = render(
        values=["knative-kpa-scale-to-zero-values.yaml"],
        set_json={"autoscaling.kpa.initialScale": 0},
    )
    assert pred(objs)["annotations"]["autoscaling.knative.dev/initial-scale"] == "0"


# ------------------------------------------------------------------ autoscaling


def test_knative_kpa_scale_to_zero(render):
    p = pred(render(values=["knative-kpa-scale-to-zero-values.yaml"]))
    assert p["minReplicas"] == 0 and p["maxReplicas"] == 4
    assert p["scaleMetric"] == "concurrency" and p["scaleTarget"] == 8
    assert p["containerConcurrency"] == 32
    assert "autoScaling" not in p


def test_knative_kpa_rps(render):
    p = pred(render(values=["knative-grpc-values.yaml"]))
    assert p["scaleMetric"] == "rps" and p["scaleTarget"] == 40


def test_standard_hpa_cpu(render):
    objs = render(values=["standard-hpa-values.yaml"])
    assert isvc(objs)["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "hpa"
    p = pred(objs)
    assert p["minReplicas"] == 2 and p["maxReplicas"] == 4
    assert p["autoScaling"]["metrics"] == [
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 70},
            },
        }
    ]
    assert "scaleMetric" not in p and "containerConcurrency" not in p


def test_standard_hpa_memory_default_target(render):
    p = pred(
        render(set_json={**SHARED, "autoscaling.maxReplicas": 3, "autoscaling.metric": "memory"})
    )
    (metric,) = p["autoScaling"]["metrics"]
    assert metric["resource"] == {
        "name": "memory",
        "target": {"type": "Utilization", "averageUtilization": 80},
    }


def test_standard_keda_gpu_utilisation(render):
    objs = render(values=["standard-keda-gpu-values.yaml"])
    assert isvc(objs)["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "keda"
    p = pred(objs)
    (metric,) = p["autoScaling"]["metrics"]
    assert metric["type"] == "External"
    ext = metric["external"]
    assert ext["metric"]["backend"] == "prometheus"
    assert ext["metric"]["serverAddress"] == "http://prometheus-operated.monitoring.svc:9090"
    assert ext["metric"]["query"] == (
        "sum(max by (exported_pod, gpu) (DCGM_FI_DEV_GPU_UTIL"
        f'{{exported_namespace="{NAMESPACE}", exported_pod=~"{PREDICTOR}-.*"}}))'
    )
    assert ext["target"] == {"type": "Value", "value": "75"}
    assert p["autoScaling"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 600}}
    assert p["minReplicas"] == 1 and p["maxReplicas"] == 8


def test_keda_gpu_utilisation_is_per_replica_with_several_gpus(render):
    p = pred(render(values=["standard-keda-gpu-values.yaml"], set_json={"gpu.count": 4}))
    query = p["autoScaling"]["metrics"][0]["external"]["metric"]["query"]
    assert query.startswith("sum(max by (exported_pod, gpu) (DCGM_FI_DEV_GPU_UTIL{")
    assert query.endswith("})) / 4")


def test_standard_keda_queue_depth(render):
    p = pred(render(values=["standard-keda-queue-depth-values.yaml"]))
    ext = p["autoScaling"]["metrics"][0]["external"]
    assert ext["metric"]["query"] == (
        f'sum(max by (pod, model, priority) (histoserve_queue_depth{{namespace="{NAMESPACE}", pod=~"{PREDICTOR}-.*"}}))'
    )
    assert ext["target"]["value"] == "128"
    assert ext["authenticationRef"] == {
        "authModes": "bearer",
        "authenticationRef": {"name": "prometheus-auth"},
    }
    assert p["deploymentStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_standard_keda_custom_query(render):
    query = 'sum(rate(histoserve_tiles_total{outcome="ok"}[1m]))'
    p = pred(
        render(
            set_json={
                **SHARED,
                "autoscaling.maxReplicas": 5,
                "autoscaling.metric": "prometheus",
                "autoscaling.target": 0.5,
                "autoscaling.keda.query": query,
            }
        )
    )
    ext = p["autoScaling"]["metrics"][0]["external"]
    assert ext["metric"]["query"] == query and ext["target"]["value"] == "0.5"


def test_fixed_replicas_when_min_equals_max(render):
    objs = render(set_json={**SHARED, "autoscaling.minReplicas": 3, "autoscaling.maxReplicas": 3})
    assert isvc(objs)["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "none"
    p = pred(objs)
    assert p["minReplicas"] == 3 and "autoScaling" not in p and "maxReplicas" not in p


def test_unset_class_with_a_range_picks_hpa(render):
    objs = render(set_json={**SHARED, "autoscaling.maxReplicas": 3})
    assert isvc(objs)["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "hpa"


def test_external_class(render):
    objs = render(
        set_json={**SHARED, "autoscaling.class": "external", "autoscaling.maxReplicas": 3}
    )
    assert isvc(objs)["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
    assert "autoScaling" not in pred(objs)
