"""``model.build`` (the init container exporting the package this node lacks) and package sets by OCI.

Rendered with the real ``helm`` and every object validated strictly (KServe's
CRD schema, the Kubernetes schemas); the ``ci/`` files
``package-set-build-values.yaml`` and ``oci-modelcar-values.yaml`` also run
through the whole render matrix (``test_chart_render.py``).
"""

from __future__ import annotations

import pytest

from tests.chart.helpers import args_of, isvc_container, one
from tests.chart.rendered import env_of, mounts_of, pred, volumes_of

BUILD = {
    "model.spec": "h0-mini",
    "model.build.enabled": True,
    "model.build.timm": "vit_base_patch14_reg4_dinov2",
    "model.build.weights": "weights/h0-mini.safetensors",
    "storage.pvc.existingClaim": "histo-models",
}


def _init(objs: list[dict]) -> dict:
    (container,) = pred(objs)["initContainers"]
    assert container["name"] == "build-package"
    return container


def _validated(render, validate_object, **kwargs) -> list[dict]:
    objs = render(**kwargs)
    for obj in objs:
        validate_object(obj)
    return objs


def test_the_init_container_exports_what_is_missing_on_the_pod_s_gpu(render, validate_object):
    objs = _validated(render, validate_object, set_json={**BUILD, "model.build.dtype": "bf16"})
    init, server = _init(objs), isvc_container(objs)
    # the serving image's export twin (docker build --target export): same torch, a compiler
    assert init["image"] == server["image"] + "-export"
    assert server["image"].rsplit(":", 1)[1]  # a tag, not a digest
    assert init["command"] == [
        "timeout",
        "--kill-after=30",
        "1800",
        "python",
        "-m",
        "predictor.export",
    ]
    assert init["args"] == [
        "--spec=h0-mini",
        "--timm=vit_base_patch14_reg4_dinov2",
        "--weights=/opt/ml/model/weights/h0-mini.safetensors",
        "--dtype=bf16",
        "--device=cuda",
        "--package_set=/opt/ml/model",
        "--if_missing",
        "--lock_timeout_s=2400",
    ]
    assert init["resources"] == server["resources"]  # the pod's own GPU
    assert init["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert init["securityContext"] == server["securityContext"]
    assert env_of(init)["TMPDIR"] == "/tmp"
    # the init container writes the set; the server reads it, read-only, and chooses
    assert "readOnly" not in mounts_of(init)["/opt/ml/model"]
    assert mounts_of(server)["/opt/ml/model"]["readOnly"] is True
    assert volumes_of(objs)["model-store"]["persistentVolumeClaim"]["readOnly"] is False
    assert volumes_of(objs)["build-scratch"]["emptyDir"] == {"sizeLimit": "20Gi"}
    assert {m["mountPath"] for m in init["volumeMounts"] if m["name"] == "build-scratch"} == {
        "/tmp", "/var/cache/histoserve", "/home/histoserve",
    }  # fmt: skip
    args = args_of(server)
    assert args["model_dir"] == "/opt/ml/model" and "checkpoint" not in args


def test_without_build_the_model_volume_stays_read_only_and_no_init_container(render):
    objs = render(set_json={"storage.pvc.existingClaim": "histo-models"})
    assert "initContainers" not in pred(objs)
    assert volumes_of(objs)["model-store"]["persistentVolumeClaim"]["readOnly"] is True
    assert "build-scratch" not in volumes_of(objs)


def test_a_cpu_pool_builds_for_its_cpu_and_a_module_source_without_weights_file(
    render, validate_object
):
    values = {
        k: v for k, v in BUILD.items() if k not in ("model.build.timm", "model.build.weights")
    }
    objs = _validated(render, validate_object, values=["cpu-values.yaml"], set_json={
        **values, "model.build.module": "labmodels.encoders:h0_mini",
        "model.build.cpuTarget": "x86-64-v3", "model.build.maxBatch": 32,
        "model.build.timeoutSeconds": 600, "model.build.lockTimeoutSeconds": 900,
        "model.build.image": "registry.example.com/histoserve-export:0.1.0",
    })  # fmt: skip
    init = _init(objs)
    assert init["image"] == "registry.example.com/histoserve-export:0.1.0"
    assert init["command"][2] == "600"
    args = init["args"]
    assert "--module=labmodels.encoders:h0_mini" in args and not any("weights" in a for a in args)
    assert args[-6:-3] == ["--max_batch=32", "--device=cpu", "--cpu_target=x86-64-v3"]
    assert "--lock_timeout_s=900" in args
    assert "nvidia.com/gpu" not in init["resources"].get("limits", {})


def test_mapped_weights_are_passed_to_the_export(render, render_error, validate_object):
    objs = _validated(
        render, validate_object, set_json={**BUILD, "model.build.weightsLayout": "mmap"}
    )
    args = _init(objs)["args"]
    assert args[args.index("--device=cuda") + 1] == "--weights_layout=mmap"
    err = render_error(set_json={**BUILD, "model.build.weightsLayout": "separate"})
    assert "weightsLayout" in err  # the schema's enum


def test_a_serving_image_by_digest_takes_a_named_export_image(render, validate_object):
    export = "registry.example.com/histoserve@sha256:" + "b" * 64
    objs = _validated(render, validate_object, set_json={
        **BUILD, "image.digest": "sha256:" + "a" * 64, "model.build.image": export,
    })  # fmt: skip
    assert _init(objs)["image"] == export
    assert isvc_container(objs)["image"].endswith("@sha256:" + "a" * 64)


def test_a_pvc_uri_s_path_is_the_set_in_both_containers(render, validate_object):
    values = {k: v for k, v in BUILD.items() if k != "storage.pvc.existingClaim"}
    objs = _validated(render, validate_object, set_json={
        **values, "storage.storageUri": "pvc://histo-models/sets/h0-mini",
    })  # fmt: skip
    init, server = _init(objs), isvc_container(objs)
    assert mounts_of(init)["/opt/ml/model"]["subPath"] == "sets/h0-mini"
    assert mounts_of(server)["/opt/ml/model"]["subPath"] == "sets/h0-mini"


def test_the_build_works_beside_a_serving_runtime(render, validate_object):
    objs = _validated(render, validate_object, values=["serving-runtime-values.yaml"],
                      set_json={k: v for k, v in BUILD.items() if not k.startswith("storage")})  # fmt: skip
    init = _init(objs)
    assert "--package_set=/opt/ml/model" in init["args"]
    assert pred(objs)["model"]["runtime"]
    assert mounts_of(pred(objs)["model"])["/opt/ml/model"]["readOnly"] is True


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"storage.storageUri": "s3://histo/h0"}, "model.build needs the model volume on a PVC"),
        ({"storage.storageUri": "oci://r.example.com/h0:1"}, "read-only for an oci:// modelcar"),
        ({"model.spec": ""}, "model.build needs a spec"),
        ({"model.build.module": "a.b:c"}, "one weights source"),
        ({"model.build.timm": ""}, "one weights source"),
        ({"model.build.weights": ""}, "model.build.timm needs model.build.weights"),
        ({"model.build.weights": "a/../../etc/x"}, "must stay inside the model volume"),
        ({"model.build.lockTimeoutSeconds": 600}, "must be >= model.build.timeoutSeconds"),
        ({"model.build.maxBatch": 16}, "batching.maxBatchSize 32 (32 when unset) is above"),
        ({"model.checkpoint": "h0.pt2"}, "leave model.checkpoint empty"),
        ({"image.digest": "sha256:" + "a" * 64}, "set model.build.image to the export image"),
    ],
)
def test_builds_that_cannot_work_are_refused_with_what_to_do(render_error, values, needle):
    settings = {**BUILD, **values}
    if "storage.storageUri" in values:
        settings.pop("storage.storageUri", None)
        settings = {**{k: v for k, v in settings.items() if not k.startswith("storage.pvc")},
                    "storage.storageUri": values["storage.storageUri"]}  # fmt: skip
    assert needle in render_error(set_json=settings)


# -- a package set shipped as an OCI image (KServe modelcar) ---------------------------------
def test_an_oci_uri_goes_to_kserve_as_the_one_storage_uri(render, validate_object):
    objs = _validated(render, validate_object, values=["oci-modelcar-values.yaml"])
    server = isvc_container(objs)
    assert (
        env_of(server)["STORAGE_URI"] == "oci://registry.example.com/histo/h0-mini-packages:2026.12"
    )
    assert args_of(server)["model_dir"] == "/mnt/models"
    assert "storageUris" not in pred(objs) and "model-store" not in volumes_of(objs)
    assert "checkpoint" not in args_of(server)  # the server takes the build that fits


def test_an_oci_uri_with_a_serving_runtime_is_the_model_s_storage_uri(render, validate_object):
    objs = _validated(render, validate_object, values=["serving-runtime-values.yaml"], set_json={
        "storage.storageUri": "oci://registry.example.com/histo/h0-mini-packages:2026.12",
    })  # fmt: skip
    model = pred(objs)["model"]
    assert model["storageUri"] == "oci://registry.example.com/histo/h0-mini-packages:2026.12"
    assert args_of(model)["model_dir"] == "/mnt/models"
    assert one(objs, "InferenceService")["spec"]["predictor"].get("storageUris") is None


def test_the_build_renders_in_knative_mode_too(render, validate_object):
    """Knative needs its init-container and PVC-write feature flags (docs/deployment.md)."""
    objs = _validated(
        render, validate_object, values=["knative-kpa-scale-to-zero-values.yaml"], set_json=BUILD
    )
    assert _init(objs)["args"][-3:] == ["--package_set=/opt/ml/model", "--if_missing",
                                        "--lock_timeout_s=2400"]  # fmt: skip
    assert volumes_of(objs)["model-store"]["persistentVolumeClaim"]["readOnly"] is False
