"""Value by value: each value changes what it should in the rendered objects."""

from __future__ import annotations

import json

import pytest

from tests.chart.helpers import (
    FULLNAME,
    MONITORING_API,
    NAMESPACE,
    PREDICTOR,
    args_of,
    by_kind,
    isvc_container,
    one,
)


def isvc(objs):
    return one(objs, "InferenceService")


def pred(objs):
    return isvc(objs)["spec"]["predictor"]


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def mounts_of(container):
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def volumes_of(objs):
    return {v["name"]: v for v in pred(objs).get("volumes", [])}


# ------------------------------------------------------------------------ model


def test_model_values_reach_server_flags(render):
    objs = render(
        set_json={
            "model.name": "h-optimus-0",
            "model.checkpoint": "h0.pt2",
            "model.spec": "h0",
            "model.device": "cuda:0",
        }
    )
    args = args_of(isvc_container(objs))
    assert args["model_name"] == "h-optimus-0"
    assert args["checkpoint"] == "h0.pt2"
    assert args["spec"] == "h0"
    assert args["device"] == "cuda:0"
    c = isvc_container(objs)
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/models/h-optimus-0/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/models/h-optimus-0/ready"


def test_model_defaults_leave_checkpoint_and_spec_to_the_server(render):
    args = args_of(isvc_container(render()))
    assert args["model_name"] == "h0-mini"
    assert "checkpoint" not in args and "spec" not in args
    assert args["device"] == "auto"


def test_kserve_container_name_ports_and_image(render):
    c = isvc_container(render())
    assert c["name"] == "kserve-container"
    assert c["image"] == "ghcr.io/histoserve/histoserve:0.1.0"  # appVersion
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("http1", 8080), ("h2c", 8081)]
    args = args_of(c)
    assert args["http_port"] == "8080" and args["grpc_port"] == "8081"


# ---------------------------------------------------------------------- storage


def test_default_storage_is_a_created_pvc_mounted_read_only(render):
    objs = render()
    pvc = one(objs, "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == f"{FULLNAME}-models"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    vol = volumes_of(objs)["model-store"]
    assert vol["persistentVolumeClaim"] == {"claimName": f"{FULLNAME}-models", "readOnly": True}
    c = isvc_container(objs)
    mount = mounts_of(c)["/opt/ml/model"]
    assert mount["readOnly"] is True and mount["name"] == "model-store"
    assert args_of(c)["model_dir"] == "/opt/ml/model"
    assert "storageUris" not in pred(objs)


def test_mount_path_moves_mount_and_model_dir(render):
    objs = render(set_json={"storage.mountPath": "/models"})
    c = isvc_container(objs)
    assert "/models" in mounts_of(c) and args_of(c)["model_dir"] == "/models"


def test_existing_claim_replaces_the_created_pvc(render):
    objs = render(
        set_json={"storage.pvc.existingClaim": "shared-models", "storage.pvc.subPath": "h0/v2"}
    )
    assert not by_kind(objs, "PersistentVolumeClaim")
    assert volumes_of(objs)["model-store"]["persistentVolumeClaim"]["claimName"] == "shared-models"
    assert mounts_of(isvc_container(objs))["/opt/ml/model"]["subPath"] == "h0/v2"


def test_created_pvc_values(render):
    objs = render(
        set_json={
            "storage.pvc.size": "200Gi",
            "storage.pvc.storageClassName": "fast",
            "storage.pvc.accessModes": ["ReadOnlyMany"],
            "storage.pvc.keep": False,
            "storage.pvc.name": "ckpts",
            "storage.pvc.annotations": {"backup": "daily"},
        }
    )
    pvc = one(objs, "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == "ckpts"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "200Gi"
    assert pvc["spec"]["storageClassName"] == "fast"
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert pvc["metadata"]["annotations"] == {"backup": "daily"}
    assert volumes_of(objs)["model-store"]["persistentVolumeClaim"]["claimName"] == "ckpts"


def test_storage_class_dash_means_no_class(render):
    pvc = one(render(set_json={"storage.pvc.storageClassName": "-"}), "PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == ""
    pvc = one(render(), "PersistentVolumeClaim")
    assert "storageClassName" not in pvc["spec"]


def test_storage_uri_uses_storage_uris_with_mount_path(render):
    objs = render(values=["storage-uri-values.yaml"])
    p = pred(objs)
    assert p["storageUris"] == [
        {"uri": "s3://histo-models/h0-mini/v1", "mountPath": "/opt/ml/model"}
    ]
    assert not by_kind(objs, "PersistentVolumeClaim")
    assert "model-store" not in volumes_of(objs)
    c = isvc_container(objs)
    assert args_of(c)["model_dir"] == "/opt/ml/model"
    assert "STORAGE_URI" not in env_of(c)


def test_storage_uri_env_mode_uses_storage_initializer_env(render):
    objs = render(values=["storage-uri-env-values.yaml"])
    c = isvc_container(objs)
    assert env_of(c)["STORAGE_URI"] == "gs://histo-models/h0-mini/v1"
    assert args_of(c)["model_dir"] == "/mnt/models"
    assert "storageUris" not in pred(objs)
    assert not by_kind(objs, "PersistentVolumeClaim")


# ------------------------------------------------------------------------ image


def test_image_tag_pull_policy_and_digest(render):
    c = isvc_container(render(set_json={"image.tag": "1.2.3", "image.pullPolicy": "Always"}))
    assert c["image"] == "ghcr.io/histoserve/histoserve:1.2.3"
    assert c["imagePullPolicy"] == "Always"
    digest = "sha256:" + "a" * 64
    c = isvc_container(render(set_json={"image.tag": "1.2.3", "image.digest": digest}))
    assert c["image"] == f"ghcr.io/histoserve/histoserve@{digest}"


def test_image_pull_secrets_accept_names_and_objects(render):
    p = pred(render(set_json={"imagePullSecrets": ["a", {"name": "b"}]}))
    assert p["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}]
    assert "imagePullSecrets" not in pred(render())


# -------------------------------------------------------------------------- GPU


def test_gpu_count_in_requests_and_limits_and_taint_toleration(render):
    objs = render(set_json={"gpu.count": 2})
    res = isvc_container(objs)["resources"]
    assert res["requests"]["nvidia.com/gpu"] == 2 and res["limits"]["nvidia.com/gpu"] == 2
    assert res["requests"]["cpu"] == "4" and res["limits"]["memory"] == "32Gi"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pred(objs)[
        "tolerations"
    ]
    assert "nodeSelector" not in pred(objs)


def test_gpu_resource_name_product_and_extra_scheduling(render):
    objs = render(
        set_json={
            "gpu.resourceName": "nvidia.com/mig-3g.40gb",
            "gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
            ],
            "affinity": {"nodeAffinity": {}},
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                }
            ],
        }
    )
    p = pred(objs)
    res = isvc_container(objs)["resources"]
    assert res["limits"]["nvidia.com/mig-3g.40gb"] == 1 and "nvidia.com/gpu" not in res["limits"]
    assert p["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert [t["key"] for t in p["tolerations"]] == ["nvidia.com/gpu", "dedicated"]
    assert p["affinity"] == {"nodeAffinity": {}}
    assert p["topologySpreadConstraints"][0]["maxSkew"] == 1


def test_gpu_count_zero_runs_on_cpu(render):
    objs = render(values=["cpu-values.yaml"])
    p = pred(objs)
    res = isvc_container(objs)["resources"]
    assert not any("gpu" in k for k in res.get("limits", {}) | res.get("requests", {}))
    assert "tolerations" not in p and "nodeSelector" not in p


def test_taint_toleration_can_be_turned_off(render):
    assert "tolerations" not in pred(render(set_json={"gpu.tolerateTaint": False}))


def test_runtime_and_priority_class(render):
    p = pred(render(set_json={"runtimeClassName": "nvidia", "priorityClassName": "high"}))
    assert p["runtimeClassName"] == "nvidia" and p["priorityClassName"] == "high"
    p = pred(render())
    assert "runtimeClassName" not in p and "priorityClassName" not in p


# --------------------------------------------------------------------- batching


def test_batching_values_reach_server_flags(render):
    args = args_of(isvc_container(render(values=["standard-keda-queue-depth-values.yaml"])))
    assert args["max_batch_size"] == "64"
    assert args["max_latency_ms"] == "10"
    assert args["max_queue_size"] == "2048"
    assert args["preprocess_workers"] == "8"


def test_batching_defaults_leave_the_server_its_defaults(render):
    args = args_of(isvc_container(render()))
    for flag in ("max_batch_size", "max_latency_ms", "max_queue_size", "preprocess_workers"):
        assert flag not in args


def test_server_values(render):
    objs = render(
        set_json={
            "server.drainTimeoutSeconds": 60,
            "server.preStopSleepSeconds": 10,
            "server.maxTilesPerRequest": 256,
            "server.maxBodyBytes": 1048576,
            "server.grpcMaxMessageBytes": 134217728,
            "server.extraArgs": ["--log_level=debug"],
            "server.extraEnv": [{"name": "FOO", "value": "bar"}],
        }
    )
    c = isvc_container(objs)
    args = args_of(c)
    assert args["drain_timeout_s"] == "60"
    assert args["max_tiles_per_request"] == "256"
    assert args["max_body_bytes"] == "1048576"
    assert args["grpc_max_receive_message_length"] == "134217728"
    assert "workers" not in args  # one process per pod: the server refuses --workers > 1
    assert args["log_level"] == "debug"
    assert env_of(c)["FOO"] == "bar"
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] == 10
    # grace period covers the preStop sleep and the drain
    assert pred(objs)["terminationGracePeriodSeconds"] == 60 + 10 + 15


def test_grace_period_override_and_no_prestop(render):
    objs = render(
        set_json={"server.terminationGracePeriodSeconds": 120, "server.preStopSleepSeconds": 0}
    )
    assert pred(objs)["terminationGracePeriodSeconds"] == 120
    assert "lifecycle" not in isvc_container(objs)


def test_grpc_message_limit_default_fits_32_raw_tiles(render):
    limit = int(args_of(isvc_container(render()))["grpc_max_receive_message_length"])
    assert limit > 32 * 224 * 224 * 3 + 64 * 1024


# ----------------------------------------------------------------- KServe batcher


def test_kserve_batcher(render):
    assert "batcher" not in pred(render())
    p = pred(render(values=["batcher-values.yaml"]))
    assert p["batcher"] == {"maxBatchSize": 16, "maxLatency": 20, "timeout": 60}


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
    assert p["minReplicas"] == 1 and p["maxReplicas"] == 4
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
    p = pred(render(set_json={"autoscaling.maxReplicas": 3, "autoscaling.metric": "memory"}))
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
        f'sum(DCGM_FI_DEV_GPU_UTIL{{exported_namespace="{NAMESPACE}", exported_pod=~"{PREDICTOR}-.*"}})'
    )
    assert ext["target"] == {"type": "Value", "value": "75"}
    assert p["autoScaling"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 600}}
    assert p["minReplicas"] == 1 and p["maxReplicas"] == 8


def test_keda_gpu_utilisation_is_per_replica_with_several_gpus(render):
    p = pred(render(values=["standard-keda-gpu-values.yaml"], set_json={"gpu.count": 4}))
    query = p["autoScaling"]["metrics"][0]["external"]["metric"]["query"]
    assert query.startswith("sum(DCGM_FI_DEV_GPU_UTIL{") and query.endswith("}) / 4")


def test_standard_keda_queue_depth(render):
    p = pred(render(values=["standard-keda-queue-depth-values.yaml"]))
    ext = p["autoScaling"]["metrics"][0]["external"]
    assert ext["metric"]["query"] == (
        f'sum(histoserve_queue_depth{{namespace="{NAMESPACE}", pod=~"{PREDICTOR}-.*"}})'
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
    objs = render(set_json={"autoscaling.minReplicas": 3, "autoscaling.maxReplicas": 3})
    assert isvc(objs)["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "none"
    p = pred(objs)
    assert p["minReplicas"] == 3 and "autoScaling" not in p and "maxReplicas" not in p


def test_unset_class_with_a_range_picks_hpa(render):
    objs = render(set_json={"autoscaling.maxReplicas": 3})
    assert isvc(objs)["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "hpa"


def test_external_class(render):
    objs = render(set_json={"autoscaling.class": "external", "autoscaling.maxReplicas": 3})
    assert isvc(objs)["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
    assert "autoScaling" not in pred(objs)


# ----------------------------------------------------------------------- probes


def test_probes(render):
    c = isvc_container(render())
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 1800
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    c = isvc_container(
        render(
            set_json={
                "probes.startup.failureThreshold": 360,
                "probes.liveness.enabled": False,
                "probes.readiness.periodSeconds": 3,
            }
        )
    )
    assert c["startupProbe"]["failureThreshold"] == 360
    assert "livenessProbe" not in c
    assert c["readinessProbe"]["periodSeconds"] == 3


# --------------------------------------------------------------------- hardening


def test_pod_and_container_hardening(render):
    objs = render()
    psc = pred(objs)["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001 and psc["fsGroup"] == 10001
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    csc = isvc_container(objs)["securityContext"]
    assert csc["readOnlyRootFilesystem"] is True
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"] == {"drop": ["ALL"]}
    assert csc["runAsNonRoot"] is True
    assert pred(objs)["automountServiceAccountToken"] is False


def test_every_writable_path_is_an_emptydir(render):
    """TMPDIR, HOME and the torch/inductor caches must land on writable emptyDirs."""
    objs = render()
    c = isvc_container(objs)
    vols = volumes_of(objs)
    writable = {
        path: m
        for path, m in mounts_of(c).items()
        if "emptyDir" in vols[m["name"]] and not m.get("readOnly")
    }
    env = env_of(c)
    for var in (
        "TMPDIR",
        "HOME",
        "XDG_CACHE_HOME",
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "CUDA_CACHE_PATH",
    ):
        value = env[var]
        assert any(value == p or value.startswith(p.rstrip("/") + "/") for p in writable), (
            f"{var}={value} is not under a writable emptyDir ({sorted(writable)})"
        )
    assert vols["tmp"]["emptyDir"]["sizeLimit"] == "32Gi"
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert mounts_of(c)["/dev/shm"]["name"] == "dshm"


def test_scratch_and_shm_values(render):
    objs = render(
        set_json={
            "scratch.tmp.sizeLimit": "64Gi",
            "scratch.tmp.medium": "Memory",
            "scratch.cache.sizeLimit": "1Gi",
            "scratch.home.sizeLimit": "128Mi",
            "shm.sizeLimit": "8Gi",
        }
    )
    vols = volumes_of(objs)
    assert vols["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert vols["cache"]["emptyDir"]["sizeLimit"] == "1Gi"
    assert vols["home"]["emptyDir"]["sizeLimit"] == "128Mi"
    assert vols["dshm"]["emptyDir"]["sizeLimit"] == "8Gi"
    objs = render(set_json={"shm.enabled": False})
    assert "dshm" not in volumes_of(objs) and "/dev/shm" not in mounts_of(isvc_container(objs))


def test_service_account(render):
    objs = render()
    sa = one(objs, "ServiceAccount")
    assert sa["metadata"]["name"] == FULLNAME and sa["automountServiceAccountToken"] is False
    assert pred(objs)["serviceAccountName"] == FULLNAME
    objs = render(values=["storage-uri-values.yaml"])
    sa = one(objs, "ServiceAccount")
    assert sa["secrets"] == [{"name": "s3-credentials"}]
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    objs = render(set_json={"serviceAccount.create": False, "serviceAccount.name": "existing"})
    assert not by_kind(objs, "ServiceAccount")
    assert pred(objs)["serviceAccountName"] == "existing"


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
    assert ingress_ports(metrics) == [8080]
    assert (
        metrics["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        == "monitoring"
    )


def test_network_policy_knative_and_batcher_ports(render):
    np_ = one(render(values=["knative-kpa-scale-to-zero-values.yaml"]), "NetworkPolicy")
    (serving,) = np_["spec"]["ingress"]
    assert ingress_ports(serving) == [8012, 8013, 8080, 8081, 9088, 9091]
    assert "from" not in serving  # allowExternal
    np_ = one(render(values=["batcher-values.yaml"]), "NetworkPolicy")
    assert 9081 in ingress_ports(np_["spec"]["ingress"][0])


def test_pod_monitor_gated_on_monitoring_api(render):
    values = ["standard-keda-gpu-values.yaml"]
    assert not by_kind(render(values=values), "PodMonitor")
    pm = one(render(values=values, api_versions=[MONITORING_API]), "PodMonitor")
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] == "http1" and ep["path"] == "/metrics"
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    forced = one(render(values=values, set_json={"metrics.skipApiCheck": True}), "PodMonitor")
    assert forced["spec"] == pm["spec"]


def test_pod_monitor_knative_scrapes_aggregated_port(render):
    pm = one(render(values=["knative-grpc-values.yaml"]), "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "aggr-metric"


def test_service_monitor(render):
    sm = one(render(values=["standard-hpa-values.yaml"]), "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "http1"
    assert sm["spec"]["endpoints"][0]["interval"] == "15s"
    objs = render(set_json={"metrics.serviceMonitor.enabled": True})
    assert not by_kind(objs, "ServiceMonitor")  # API not present


def test_scrape_annotations(render):
    ann = pred(render())["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "8080"
    assert ann["prometheus.io/path"] == "/metrics"
    assert ann["serving.kserve.io/enable-prometheus-scraping"] == "false"
    ann = pred(render(values=["knative-kpa-scale-to-zero-values.yaml"]))["annotations"]
    assert ann["serving.kserve.io/enable-prometheus-scraping"] == "true"
    assert ann["serving.kserve.io/enable-metric-aggregation"] == "true"
    assert ann["prometheus.kserve.io/port"] == "8080"
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
    assert p["storageUris"] == [{"uri": "pvc://histo-models/h0-mini", "mountPath": "/opt/ml/model"}]
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
