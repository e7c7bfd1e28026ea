"""Value by value: model, storage and image (server flags, the model volume, the image).

Each value changes what it should in the rendered objects.
"""

from __future__ import annotations

from tests.chart.helpers import (
    FULLNAME,
    args_of,
    by_kind,
    isvc_container,
    one,
)
from tests.chart.rendered import env_of, mounts_of, pred, volumes_of

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
    assert "checkpoint" not in args and "spec" not in args and "model_class" not in args
    assert args["device"] == "auto"


def test_model_class_reaches_the_server_flag(render):
    """A user's BaseServerModel subclass, importable via PYTHONPATH from server.extraEnv."""
    objs = render(
        set_json={
            "model.modelClass": "my_models.tiles:UnitNormEmbedder",
            "server.extraEnv": [{"name": "PYTHONPATH", "value": "/opt/ml/model/code"}],
        }
    )
    c = isvc_container(objs)
    assert args_of(c)["model_class"] == "my_models.tiles:UnitNormEmbedder"
    assert {"name": "PYTHONPATH", "value": "/opt/ml/model/code"} in c["env"]


def test_kserve_container_name_ports_and_image(render):
    c = isvc_container(render())
    assert c["name"] == "kserve-container"
    assert c["image"] == "ghcr.io/histoserve/histoserve:0.1.0"  # appVersion
    ports = [(p["name"], p["containerPort"]) for p in c["ports"]]
    assert ports == [("http1", 8080), ("h2c", 8081), ("metrics", 8082)]
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
