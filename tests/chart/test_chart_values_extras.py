"""Value by value: optional objects, serving runtimes, the helm test pod, names, labels.

Each value changes what it should in the rendered objects.
"""

from __future__ import annotations

import json

import pytest

from tests.chart.helpers import (
    MONITORING_API,
    NAMESPACE,
    PREDICTOR,
    args_of,
    by_kind,
    isvc_container,
    one,
)
from tests.chart.rendered import env_of, isvc, mounts_of, pred, volumes_of

# ---------------------------------------------------------------------- optional


def test_pod_disruption_budget(render):
    assert not by_kind(render(), "PodDisruptionBudget")
    pdb = one(render(values=["standard-keda-gpu-values.yaml"]), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    pdb = one(render(values=["standard-hpa-values.yaml"]), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1 and "maxUnavailable" not in pdb["spec"]


def ingress_ports(rule):
    return sorted(p["port"] for p in rule["ports"])


def test_network_policy_restricted(render):
    assert not by_kind(render(), "NetworkPolicy")
    np_ = one(render(values=["standard-keda-gpu-values.yaml"]), "NetworkPolicy")
    serving, metrics = np_["spec"]["ingress"]
    assert ingress_ports(serving) == [8080, 8081]
    test_peer, gateway = serving["from"]
    assert test_peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "test"
    assert gateway["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "istio-system"
    }
    assert ingress_ports(metrics) == [8082]  # the metrics port alone, not the model's
    assert (
        metrics["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        == "monitoring"
    )


def test_network_policy_knative_and_batcher_ports(render):
    np_ = one(render(values=["knative-kpa-scale-to-zero-values.yaml"]), "NetworkPolicy")
    serving, knative, metrics = np_["spec"]["ingress"]
    assert ingress_ports(serving) == [8012, 8013, 8080, 8081]
    assert "from" not in serving  # allowExternal
    assert ingress_ports(knative) == [8012, 8013, 9090]  # activator, autoscaler
    assert ingress_ports(metrics) == [8082, 9088, 9091] and "from" not in metrics
    np_ = one(render(values=["batcher-values.yaml"]), "NetworkPolicy")
    assert 9081 in ingress_ports(np_["spec"]["ingress"][0])


def test_pod_monitor_gated_on_monitoring_api(render):
    values = ["standard-keda-gpu-values.yaml"]
    assert not by_kind(render(values=values), "PodMonitor")
    pm = one(render(values=values, api_versions=[MONITORING_API]), "PodMonitor")
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] == "metrics" and ep["path"] == "/metrics"
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    forced = one(render(values=values, set_json={"metrics.skipApiCheck": True}), "PodMonitor")
    assert forced["spec"] == pm["spec"]


def test_pod_monitor_knative_scrapes_aggregated_port(render):
    pm = one(render(values=["knative-grpc-values.yaml"]), "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "aggr-metric"


def test_service_monitor(render):
    sm = one(render(values=["standard-hpa-values.yaml"]), "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["endpoints"][0]["interval"] == "15s"
    objs = render(set_json={"metrics.serviceMonitor.enabled": True})
    assert not by_kind(objs, "ServiceMonitor")  # API not present


def test_scrape_annotations(render):
    ann = pred(render())["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "8082"
    assert ann["prometheus.io/path"] == "/metrics"
    assert ann["serving.kserve.io/enable-prometheus-scraping"] == "false"
    ann = pred(render(values=["knative-kpa-scale-to-zero-values.yaml"]))["annotations"]
    assert ann["serving.kserve.io/enable-prometheus-scraping"] == "true"
    assert ann["serving.kserve.io/enable-metric-aggregation"] == "true"
    assert ann["prometheus.kserve.io/port"] == "8082"
    assert "prometheus.io/port" not in ann
    assert "annotations" not in pred(render(set_json={"metrics.scrapeAnnotations": False}))


# ------------------------------------------------------------- serving runtime


def test_cluster_serving_runtime(render):
    objs = render(values=["serving-runtime-values.yaml"])
    rt = one(objs, "ClusterServingRuntime")
    assert rt["metadata"]["name"] == "histoserve" and "namespace" not in rt["metadata"]
    spec = rt["spec"]
    assert spec["supportedModelFormats"] == [
        {"name": "pt2", "version": "1", "autoSelect": True, "priority": 1}
    ]
    assert set(spec["protocolVersions"]) == {"v1", "v2", "grpc-v2"}
    (c,) = spec["containers"]
    assert c["name"] == "kserve-container"
    assert "--model_name={{.Name}}" in c["args"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    p = pred(objs)
    assert "containers" not in p
    assert p["model"]["modelFormat"] == {"name": "pt2"} and p["model"]["runtime"] == "histoserve"
    # pvc:// is the chart's own volume (KServe's storageUris would drop the path)
    assert "storageUris" not in p
    assert volumes_of(objs)["model-store"]["persistentVolumeClaim"]["claimName"] == "histo-models"
    assert mounts_of(p["model"])["/opt/ml/model"]["subPath"] == "h0-mini"
    # the InferenceService's args follow the runtime's, so its --model_dir wins
    assert args_of(p["model"])["model_dir"] == "/opt/ml/model"


def test_namespaced_serving_runtime(render):
    objs = render(set_json={"servingRuntime.create": True, "servingRuntime.kind": "ServingRuntime"})
    rt = one(objs, "ServingRuntime")
    assert rt["metadata"]["namespace"] == NAMESPACE
    assert "containers" in pred(objs)  # create without use: the InferenceService keeps its image


# ------------------------------------------------------------------------ tests


def test_helm_test_pod(render):
    objs = render()
    pod = one(objs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (c,) = pod["spec"]["containers"]
    env = env_of(c)
    assert env["HISTOSERVE_MODEL"] == "h0-mini"
    assert env["HISTOSERVE_PROTOCOL"] == "http"
    assert env["HISTOSERVE_TARGETS"].split() == [
        f"http://{PREDICTOR}.{NAMESPACE}.svc",
        f"http://{PREDICTOR}.{NAMESPACE}.svc:8080",
    ]
    assert c["image"] == isvc_container(objs)["image"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])
    cm = one(objs, "ConfigMap")
    assert "def run_http" in cm["data"]["v2_smoke_test.py"]
    assert cm["metadata"]["annotations"]["helm.sh/hook"] == "test"


def test_helm_test_grpc_and_overrides(render):
    pod = one(render(values=["knative-grpc-values.yaml"]), "Pod")
    env = env_of(pod["spec"]["containers"][0])
    assert env["HISTOSERVE_PROTOCOL"] == "grpc"
    assert env["HISTOSERVE_TARGETS"].split()[0] == f"{PREDICTOR}.{NAMESPACE}.svc:80"
    pod = one(
        render(
            set_json={
                "tests.url": "http://gw.example/x",
                "tests.image.repository": "python",
                "tests.image.tag": "3.12-slim",
            }
        ),
        "Pod",
    )
    c = pod["spec"]["containers"][0]
    assert env_of(c)["HISTOSERVE_TARGETS"] == "http://gw.example/x"
    assert c["image"] == "python:3.12-slim"
    assert not by_kind(render(set_json={"tests.enabled": False}), "Pod")


def test_helm_test_tile_size_follows_spec(render):
    pod = one(render(values=["cpu-values.yaml"]), "Pod")
    assert env_of(pod["spec"]["containers"][0])["HISTOSERVE_TILE_SIZE"] == "512"


# ------------------------------------------------------------- names and labels


def test_standard_labels_on_every_object(render):
    objs = render(
        api_versions=[MONITORING_API],
        set_json={
            "commonLabels": {"team": "pathology"},
            "commonAnnotations": {"owner": "ml"},
            "servingRuntime.create": True,
            "podDisruptionBudget.enabled": True,
            "networkPolicy.enabled": True,
            "metrics.podMonitor.enabled": True,
            "metrics.serviceMonitor.enabled": True,
            "metrics.dashboard.enabled": True,
        },
    )
    kinds = {o["kind"] for o in objs}
    assert kinds == {
        "ServiceAccount",
        "PersistentVolumeClaim",
        "InferenceService",
        "ClusterServingRuntime",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "PodMonitor",
        "ServiceMonitor",
        "ConfigMap",
        "Pod",
    }
    assert len(objs) >= 7
    for o in objs:
        labels = o["metadata"]["labels"]
        for key in (
            "helm.sh/chart",
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
        ):
            assert key in labels, f"{o['kind']} lacks {key}"
        assert labels["team"] == "pathology", o["kind"]
        assert o["metadata"]["annotations"]["owner"] == "ml", o["kind"]


def test_names_and_metadata_values(render):
    objs = render(
        set_json={
            "fullnameOverride": "tiles",
            "labels": {"tier": "gold"},
            "annotations": {"note": "x"},
            "podLabels": {"pl": "1"},
            "podAnnotations": {"pa": "2"},
        }
    )
    i = isvc(objs)
    assert i["metadata"]["name"] == "tiles"
    assert i["metadata"]["labels"]["tier"] == "gold" and i["metadata"]["annotations"]["note"] == "x"
    assert pred(objs)["labels"]["pl"] == "1" and pred(objs)["annotations"]["pa"] == "2"
    assert isvc(render(set_json={"nameOverride": "hsv"}))["metadata"]["name"] == "hs-hsv"


def test_extra_volumes_and_mounts(render):
    objs = render(
        set_json={
            "extraVolumes": [{"name": "genes", "configMap": {"name": "genes"}}],
            "extraVolumeMounts": [{"name": "genes", "mountPath": "/opt/genes", "readOnly": True}],
        }
    )
    assert volumes_of(objs)["genes"]["configMap"] == {"name": "genes"}
    assert mounts_of(isvc_container(objs))["/opt/genes"]["name"] == "genes"


@pytest.mark.parametrize("mode", ["Standard", "Knative"])
def test_deployment_strategy_only_in_standard(render, mode):
    if mode == "Standard":
        p = pred(render(set_json={"deploymentStrategy": {"type": "Recreate"}}))
        assert p["deploymentStrategy"] == {"type": "Recreate"}
    else:
        assert "deploymentStrategy" not in pred(render(set_json={"deploymentMode": "Knative"}))


def test_network_policy_admits_named_namespaces_and_embed_jobs(render):
    np_ = one(render(values=["network-policy-protected-values.yaml"]), "NetworkPolicy")
    serving, metrics = np_["spec"]["ingress"]
    assert ingress_ports(serving) == [8080, 8081]
    test_peer, gateway, embed_ns, embed_jobs = serving["from"]
    assert test_peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "test"
    names = [p["namespaceSelector"]["matchLabels"] for p in (gateway, embed_ns)]
    assert names == [
        {"kubernetes.io/metadata.name": "istio-system"},
        {"kubernetes.io/metadata.name": "pathology-embed"},
    ]
    # The histoserve-embed chart's pod labels, whatever its release or nameOverride.
    assert embed_jobs == {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/part-of": "histoserve",
                "app.kubernetes.io/component": "embed",
            }
        }
    }
    assert ingress_ports(metrics) == [8082]
    # allowExternal wins: the shortcuts only narrow a restricted policy.
    open_np = one(
        render(set_json={"networkPolicy.enabled": True, "networkPolicy.allowedNamespaces": ["a"]}),
        "NetworkPolicy",
    )
    assert "from" not in open_np["spec"]["ingress"][0]
