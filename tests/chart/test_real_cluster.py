"""charts/histoserve on a real cluster: what KServe, Knative and Kubernetes do with it.

Schema validation (``test_chart_render.py``) says the objects are accepted;
these tests render each case and apply what the cluster then does
(:mod:`tests.chart.cluster`): Knative's liveness rewrite and security-context
mask, KServe's pvc:// mount, NetworkPolicy admission, Prometheus' scrapes
feeding KEDA's query, the kubelet's probe timing, the eviction API.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.chart.cluster import (
    Peer,
    admitted,
    evaluate,
    knative_liveness,
    knative_refuses_security_context,
    kserve_model_mount,
    quantity_bytes,
)
from tests.chart.helpers import CHART, MONITORING_API, NAMESPACE, PREDICTOR, args_of, one
from tests.chart.helpers import isvc_container as container
from tests.chart.rendered import env_of, pred

SHARED = {"storage.pvc.existingClaim": "histo-models"}
PROMETHEUS = Peer("monitoring", {"app.kubernetes.io/name": "prometheus"})
AUTOSCALER = Peer("knative-serving", {"app": "autoscaler"})
STRANGER = Peer("elsewhere", {"app": "curious"})


# ---------------------------------------------------- 1. Knative + gRPC liveness


@pytest.mark.parametrize("version", [(1, 15), (1, 21), (1, 22)])
def test_knative_grpc_liveness_still_reaches_the_http_server(render, version):
    """After Knative's rewrite the probe must not land on the gRPC port (8081)."""
    c = container(render(values=["knative-grpc-values.yaml"]))
    assert [p["containerPort"] for p in c["ports"]] == [8081]
    probe = knative_liveness(c, version)
    if "httpGet" in probe:
        assert probe["httpGet"]["port"] == 8080, f"liveness rewritten to {probe['httpGet']['port']}"
    else:
        command = " ".join(probe["exec"]["command"])
        assert "http://127.0.0.1:8080/v2/health/live" in command
        assert probe["timeoutSeconds"] > 1


def test_knative_http_and_standard_keep_the_http_liveness(render):
    for values in ([], ["knative-kpa-scale-to-zero-values.yaml"]):
        probe = knative_liveness(container(render(values=values)), (1, 15))
        assert probe["httpGet"] == {"path": "/v2/health/live", "port": 8080}


def test_the_runtimes_liveness_survives_a_knative_grpc_isvc(render):
    (c,) = one(render(values=["serving-runtime-values.yaml"]), "ClusterServingRuntime")["spec"][
        "containers"
    ]
    assert "exec" in c["livenessProbe"]


# ------------------------------------------------ 2. Knative's security-context mask


@pytest.mark.parametrize("version", [(1, 15), (1, 17)])
def test_knative_admits_the_container_security_context(render, version):
    c = container(render(values=["knative-kpa-scale-to-zero-values.yaml"]))
    assert not knative_refuses_security_context(c["securityContext"], version)
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_a_privileged_key_is_refused_in_knative_mode(render, render_error):
    err = render_error(
        set_json={"deploymentMode": "Knative", "securityContext.privileged": True, **SHARED}
    )
    assert "privileged" in err
    c = container(render(set_json={"securityContext.privileged": False}))
    assert c["securityContext"]["privileged"] is False  # Standard: the user's choice


# ------------------------------------------------------------ 3. pvc:// with a path


@pytest.mark.parametrize("mode", ["storageUris", "env"])
def test_a_pvc_uri_serves_its_path(render, mode):
    objs = render(values=["serving-runtime-values.yaml"], set_json={"storage.storageUriMode": mode})
    p = pred(objs)
    model_dir = args_of(container(objs))["model_dir"]
    assert kserve_model_mount(p, container(objs), model_dir) == ("histo-models", "h0-mini")
    assert not p.get("storageUris") and "STORAGE_URI" not in env_of(container(objs))


def test_a_pvc_uri_without_claim_is_refused(render_error):
    assert "pvc://" in render_error(set_json={"storage.storageUri": "pvc:///h0-mini"})


# ------------------------------------------- 6. autoscalers and Prometheus behind the policy


def test_knative_autoscaler_and_activator_pass_a_closed_policy(render):
    np_ = one(
        render(
            values=["knative-kpa-scale-to-zero-values.yaml"],
            set_json={"networkPolicy.allowExternal": False},
        ),
        "NetworkPolicy",
    )
    assert admitted(np_, 9090, AUTOSCALER)  # queue-proxy's autoscaling metrics
    assert admitted(np_, 8012, AUTOSCALER)  # the activator, scale from zero
    assert not admitted(np_, 9090, STRANGER)


@pytest.mark.parametrize("values", ["network-policy-protected-values.yaml", None])
def test_prometheus_reaches_the_metrics_and_not_the_model(render, values):
    sets = {} if values else {"networkPolicy.enabled": True, "networkPolicy.allowExternal": False}
    objs = render(values=[values] if values else [], set_json=sets)
    np_ = one(objs, "NetworkPolicy")
    port = int(pred(objs)["annotations"]["prometheus.io/port"])
    assert port == 8082 and args_of(container(objs))["metrics_port"] == "8082"
    assert admitted(np_, port, PROMETHEUS)
    assert not admitted(np_, 8080, PROMETHEUS) and not admitted(np_, 8081, PROMETHEUS)
    if not values:  # empty metricsFrom means anywhere, for the metrics port only
        assert admitted(np_, port, STRANGER) and not admitted(np_, 8080, STRANGER)


def test_an_empty_metrics_from_cannot_open_the_inference_port(render_error):
    err = render_error(
        set_json={
            "networkPolicy.enabled": True,
            "networkPolicy.allowExternal": False,
            "metrics.port": 0,
        }
    )
    assert "metricsFrom" in err


def test_the_queue_depth_preset_is_picked_up_by_kube_prometheus_stack(render):
    objs = render(
        values=[str(CHART / "presets/keda-queue-depth.yaml")],
        set_json=SHARED,
        api_versions=[MONITORING_API],
    )
    pm = one(objs, "PodMonitor")
    assert pm["metadata"]["labels"].get("release") == "kube-prometheus-stack"
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert {"name": "metrics", "containerPort": 8082, "protocol": "TCP"} in container(objs)["ports"]


def _query(objs: list[dict]) -> str:
    return pred(objs)["autoScaling"]["metrics"][0]["external"]["metric"]["query"]


def test_a_pod_scraped_twice_counts_once(render):
    query = _query(render(values=["standard-keda-queue-depth-values.yaml"]))
    pods = {f"{PREDICTOR}-7d9c-a": 100.0, f"{PREDICTOR}-7d9c-b": 30.0}
    series = [
        ("histoserve_queue_depth", {"namespace": NAMESPACE, "pod": pod, "job": job}, depth)
        for pod, depth in pods.items()
        for job in ("podmonitor", "servicemonitor")
    ]
    assert evaluate(query, series) == 130.0


def test_the_gpu_preset_matches_dcgm_series_as_scraped(render):
    """dcgm-exporter's pod label arrives as exported_pod (no honorLabels): the preset must match."""
    query = _query(
        render(values=[str(CHART / "presets/keda-gpu-utilization.yaml")], set_json=SHARED)
    )
    series = [
        (
            "DCGM_FI_DEV_GPU_UTIL",
            {
                "namespace": "gpu-operator",
                "pod": "nvidia-dcgm-exporter-x1",
                "exported_namespace": NAMESPACE,
                "exported_pod": f"{PREDICTOR}-5f-{i}",
                "gpu": "0",
            },
            90.0,
        )
        for i in range(2)
    ]
    assert evaluate(query, series) == 180.0


# ------------------------------------------------------------- 7. cold starts


@pytest.mark.parametrize("values", [None, "knative-kpa-scale-to-zero-values.yaml"])
def test_a_loaded_replica_is_ready_within_two_seconds(render, values):
    """Worst case from "model loaded" to Ready: a startup period, then a readiness period."""
    c = container(render(values=[values] if values else [], set_json=SHARED))
    delay = c["startupProbe"]["periodSeconds"] + c["readinessProbe"]["periodSeconds"]
    assert delay <= 2
    budget = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    assert budget >= 1800  # a big checkpoint still has 30 min to load


def test_knative_waits_long_enough_for_a_cold_gpu_node(render, render_error):
    p = pred(render(set_json={"deploymentMode": "Knative"}))
    assert p["timeout"] >= 600
    assert "maxRevisionTimeoutSeconds" in render_error(
        set_json={"deploymentMode": "Knative", "knative.timeoutSeconds": 1800}
    )
    p = pred(
        render(
            set_json={
                "deploymentMode": "Knative",
                "knative.timeoutSeconds": 1800,
                "knative.maxRevisionTimeoutSeconds": 3600,
            }
        )
    )
    assert p["timeout"] == 1800


# -------------------------------------------------------- 8. threads from the pod


@pytest.mark.parametrize(
    ("cpu", "device", "workers", "threads"),
    [("4", "auto", "4", "4"), ("2500m", "auto", "3", "3"), ("8", "cpu", "8", "4")],
)
def test_threads_follow_the_cpu_request_not_the_node(render, cpu, device, workers, threads):
    objs = render(set_json={"resources.requests.cpu": cpu, "model.device": device, "gpu.count": 0})
    c = container(objs)
    assert args_of(c)["preprocess_workers"] == workers
    env = env_of(c)
    assert env["OMP_NUM_THREADS"] == threads and env["MKL_NUM_THREADS"] == threads


def test_the_users_thread_settings_win(render):
    objs = render(
        set_json={
            "batching.preprocessWorkers": 16,
            "server.extraEnv": [{"name": "OMP_NUM_THREADS", "value": "2"}],
        }
    )
    c = container(objs)
    assert args_of(c)["preprocess_workers"] == "16"
    assert [e["value"] for e in c["env"] if e["name"] == "OMP_NUM_THREADS"] == ["2"]


# ---------------------------------------------------------------- 9. the smaller ones


def test_a_one_node_pvc_with_several_replicas_is_refused(render, render_error):
    assert "Multi-Attach" in render_error(set_json={"autoscaling.maxReplicas": 8})
    render(set_json={"autoscaling.maxReplicas": 8, "storage.pvc.accessModes": ["ReadOnlyMany"]})


def test_the_scheduler_reserves_the_scratch_disk(render):
    objs = render()
    requested = quantity_bytes(container(objs)["resources"]["requests"]["ephemeral-storage"])
    volumes = pred(objs)["volumes"]
    on_disk = sum(
        quantity_bytes(v["emptyDir"]["sizeLimit"])
        for v in volumes
        if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory"
    )
    assert on_disk >= 40 * 2**30 and requested >= on_disk


def _evictions_allowed(pdb: dict, replicas: int) -> int:
    """The eviction API's disruptionsAllowed with every replica healthy."""
    spec = pdb["spec"]
    if "minAvailable" in spec:
        return max(0, replicas - int(spec["minAvailable"]))
    raw = spec["maxUnavailable"]  # a percentage rounds up, as the disruption controller does
    return math.ceil(replicas * int(raw[:-1]) / 100) if isinstance(raw, str) else int(raw)


@pytest.mark.parametrize("values", [None, "standard-hpa-values.yaml"])
def test_a_drain_can_evict_a_replica_at_min_replicas(render, values):
    sets = {} if values else {"podDisruptionBudget.enabled": True}
    objs = render(values=[values] if values else [], set_json=sets)
    pdb = one(objs, "PodDisruptionBudget")
    assert _evictions_allowed(pdb, pred(objs)["minReplicas"]) >= 1


@pytest.mark.parametrize("min_available", [1, "50%"])
def test_a_pdb_blocking_drains_is_refused(render, render_error, min_available):
    """minAvailable 1, or 50% rounded up to 1, of one replica lets no pod be evicted."""
    pdb = {"podDisruptionBudget.enabled": True, "podDisruptionBudget.minAvailable": min_available}
    assert "drain" in render_error(set_json=pdb)
    render(set_json={**pdb, **SHARED, "autoscaling.minReplicas": 3, "autoscaling.maxReplicas": 3})


LOOKUP = 'lookup "serving.kserve.io/v1beta1" "InferenceService" .Release.Namespace'


def _upgrade(helm_bin: str, chart: Path, live_mode: str, mode: str) -> subprocess.CompletedProcess:
    """``helm template`` of ``chart`` whose lookup of the live InferenceService returns one in
    ``live_mode`` (``status.deploymentMode``, as KServe records it)."""
    live = json.dumps({"status": {"deploymentMode": live_mode}})
    return subprocess.run(
        [helm_bin, "template", "hs", str(chart), "-n", NAMESPACE, "--set-json", f"live={live}",
         "--set", f"deploymentMode={mode}", "--set", "storage.pvc.existingClaim=m"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_deployment_mode_change_is_refused_on_upgrade(helm_bin, tmp_path):
    """KServe's webhook refuses the change; the chart says so first, from the live object.

    ``lookup`` needs a cluster: a copy of the chart reads the "live" object from a
    value instead (and drops the strict schema, which knows no such value).
    """
    chart = tmp_path / "histoserve"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").unlink()
    helpers = chart / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    assert LOOKUP in text
    helpers.write_text(re.sub(re.escape(LOOKUP) + r" \([^)]*\)", "(.Values.live)", text))
    refused = _upgrade(helm_bin, chart, "Serverless", "Standard")  # KServe's old name of Knative
    assert refused.returncode != 0 and "KServe refuses to change it" in refused.stderr
    assert _upgrade(helm_bin, chart, "RawDeployment", "Standard").returncode == 0
    assert _upgrade(helm_bin, chart, "Knative", "Knative").returncode == 0
    assert "KServe's webhook refuses to change the mode" in (CHART / "values.yaml").read_text()
