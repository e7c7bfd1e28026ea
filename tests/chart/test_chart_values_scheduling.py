"""Value by value: GPU, batching and the KServe agent batcher.

Each value changes what it should in the rendered objects.
"""

from __future__ import annotations

from tests.chart.helpers import (
    args_of,
    isvc_container,
)
from tests.chart.rendered import env_of, pred

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
    for flag in ("max_batch_size", "max_latency_ms", "max_queue_size"):
        assert flag not in args
    # decode threads: the CPU request, not the server's default (every CPU of the node)
    assert args["preprocess_workers"] == "4"


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


def test_instances_per_device_reaches_the_server_flag(render):
    assert "instances_per_device" not in args_of(isvc_container(render()))  # null: auto
    for count in (1, 2):
        objs = render(set_json={"batching.instancesPerDevice": count, "gpu.count": 0})
        assert args_of(isvc_container(objs))["instances_per_device"] == str(count)


def test_several_gpus_are_served_by_device_auto(render, render_error):
    """``gpu.count: 2`` with ``auto`` (one worker per GPU) renders; one named GPU is refused."""
    args = args_of(isvc_container(render(set_json={"gpu.count": 2})))
    assert args["device"] == "auto"
    err = render_error(set_json={"gpu.count": 2, "model.device": "cuda:0"})
    assert 'gpu.count 2 but model.device "cuda:0" serves one GPU' in err
    args = args_of(isvc_container(render(set_json={"gpu.count": 1, "model.device": "cuda:0"})))
    assert args["device"] == "cuda:0"


def test_instances_per_device_above_one_runs_on_gpus(render, render_error):
    """Several instances per GPU are served now (own normaliser and stream per instance)."""
    objs = render(set_json={"gpu.count": 2, "batching.instancesPerDevice": 3})
    container = isvc_container(objs)
    args = args_of(container)
    assert (args["instances_per_device"], args["device"]) == ("3", "auto")
    assert container["resources"]["limits"]["nvidia.com/gpu"] in (2, "2")
    err = render_error(set_json={"batching.instancesPerDevice": 0})
    assert "instancesPerDevice" in err  # the schema's minimum 1


def test_frontends_reach_the_server_flag(render, render_error):
    """``server.frontends``: 1 adds no flag; a number passes; ``auto`` follows the CPU request."""
    assert "frontends" not in args_of(isvc_container(render()))
    args = args_of(isvc_container(render(set_json={"server.frontends": 3})))
    assert args["frontends"] == "3"
    cases = {"4": "3", "8000m": "7", "1": None, "1500m": None, "12.5": "11"}
    for cpu, want in cases.items():
        objs = render(set_json={"server.frontends": "auto", "resources.requests.cpu": cpu})
        assert args_of(isvc_container(objs)).get("frontends") == want, cpu
    assert "frontends" in render_error(set_json={"server.frontends": 0})
    assert "frontends" in render_error(set_json={"server.frontends": "many"})
