"""``models:``: several models in one server, one folder each in the model volume.

Rendered with the real ``helm``, every object validated strictly (KServe's CRD
schemas, the Kubernetes schemas); the settings the chart renders are read by
the server's own :func:`predictor.repository.settings.model_settings`, so a key
the server would refuse fails here. ``ci/models-values.yaml`` also runs through
the whole render matrix (``test_chart_render.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from predictor.config import BatchingConfig, ModelConfig
from predictor.repository.settings import model_settings
from tests.chart.helpers import args_of, isvc_container
from tests.chart.rendered import mounts_of, pred, volumes_of

TWO = {
    "models": [
        {"name": "h0-mini", "batching": {"maxBatchSize": 64, "maxLatencyMs": 5}},
        {"name": "tissue-seg", "spec": "tissue-seg", "weight": 3, "batching": {"maxBatchSize": 8}},
    ],
    "storage.pvc.existingClaim": "histo-models",
}
SETTINGS_DIR = "/etc/histoserve/models"


def _settings_map(objs: list[dict]) -> dict:
    (found,) = [
        o
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-model-settings")
    ]
    return found


def _validated(render, validate_object, **kwargs) -> list[dict]:
    objs = render(**kwargs)
    for obj in objs:
        validate_object(obj)
    return objs


def test_a_two_model_release_serves_both_folders_with_their_settings(
    render, validate_object, tmp_path: Path
):
    objs = _validated(render, validate_object, set_json=TWO)
    server = isvc_container(objs)
    args = args_of(server)
    assert args["model_dir"] == "/opt/ml/model" and args["models"] == "h0-mini,tissue-seg"
    assert args["model_settings"] == SETTINGS_DIR
    assert not {"model_name", "checkpoint", "spec", "model_class"} & set(args)
    assert server["readinessProbe"]["httpGet"]["path"] == "/v2/models/h0-mini/ready"
    assert mounts_of(server)[SETTINGS_DIR]["readOnly"] is True
    assert mounts_of(server)["/opt/ml/model"]["readOnly"] is True
    config_map = _settings_map(objs)
    assert volumes_of(objs)["model-settings"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert "initContainers" not in pred(objs)
    for name, data in config_map["data"].items():  # as the server reads them
        (tmp_path / name).write_text(data)
    a, b = (
        model_settings(n, tmp_path / n, ModelConfig(), BatchingConfig(), tmp_path)
        for n in ("h0-mini", "tissue-seg")
    )
    assert (a[1].max_batch_size, a[1].max_latency_ms, a[0].spec) == (64, 5, None)
    assert (b[1].max_batch_size, b[0].spec, b[1].weight) == (8, "tissue-seg", 3)
    assert a[1].weight == 1


def test_one_model_is_the_list_of_one_and_today_s_values_render_as_before(render):
    objs = render()
    args = args_of(isvc_container(objs))
    assert args["model_name"] == "h0-mini" and "models" not in args
    assert not [o for o in objs if o["metadata"]["name"].endswith("-model-settings")]
    one_entry = render(set_json={"models": [{"name": "h0-mini"}]})
    assert args_of(isvc_container(one_entry))["models"] == "h0-mini"


def test_each_built_model_gets_its_init_container_into_its_own_folder(render, validate_object):
    objs = _validated(render, validate_object, values=["models-values.yaml"])
    (init,) = pred(objs)["initContainers"]
    assert init["name"] == "build-0-h0-mini"
    assert init["args"] == [
        "--spec=h0-mini",
        "--timm=vit_base_patch14_reg4_dinov2",
        "--weights=/opt/ml/model/weights/h0-mini.safetensors",
        "--dtype=bf16",
        "--max_batch=64",
        "--device=cuda",
        "--package_set=/opt/ml/model/h0-mini",
        "--if_missing",
        "--lock_timeout_s=2400",
    ]
    assert volumes_of(objs)["model-store"]["persistentVolumeClaim"]["readOnly"] is False
    assert mounts_of(isvc_container(objs))["/opt/ml/model"]["readOnly"] is True


def test_a_modelcar_holds_the_folders_at_its_root(render, validate_object):
    objs = _validated(
        render,
        validate_object,
        set_json={"models": TWO["models"], "storage.storageUri": "oci://registry.example/m:1"},
    )
    args = args_of(isvc_container(objs))
    assert args["model_dir"] == "/mnt/models" and args["models"] == "h0-mini,tissue-seg"


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"models": [{"name": "a"}, {"name": "a", "spec": "h0-mini"}]}, '"a" is listed twice'),
        ({**TWO, "model.build.enabled": True}, "set build.enabled on each models: entry"),
        ({**TWO, "model.checkpoint": "h0-mini.pt2"}, "model.checkpoint, model.spec"),
        (
            {
                "models": [{"name": "a", "build": {"enabled": True, "module": "m:f"}}],
                "storage.storageUri": "oci://registry.example/m:1",
            },
            "build needs the model volume on a PVC",
        ),
        (
            {"models": [{"name": "a", "build": {"enabled": True, "module": "m:f"}}]},
            "a: build needs a spec",
        ),
        ({"models": [{"name": ".."}]}, "models"),
        ({"models": [{"name": "a/b"}]}, "models"),
        ({"models": [{"name": "a", "weight": 0}]}, "weight"),
    ],
)
def test_models_that_cannot_work_are_refused_with_what_to_do(render_error, values, needle):
    assert needle in render_error(set_json=values)


def test_the_settings_are_json_the_server_takes(render):
    objs = render(set_json={"models": [{"name": "m", "batching": {"instancesPerDevice": 1}}]})
    data = _settings_map(objs)["data"]
    assert json.loads(data["m.json"]) == {"instances_per_device": 1}


def test_front_ends_serve_the_model_folders(render, validate_object):
    """--frontends > 1 serves every folder (the device owner loads them; each front end decodes)."""
    objs = _validated(render, validate_object, set_json={**TWO, "server.frontends": 2})
    args = args_of(isvc_container(objs))
    assert args["frontends"] == "2" and args["models"] == "h0-mini,tissue-seg"
