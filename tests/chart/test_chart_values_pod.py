"""Value by value: probes and hardening (security contexts, writable paths, account).

Each value changes what it should in the rendered objects.
"""

from __future__ import annotations

import pytest

from tests.chart.helpers import (
    FULLNAME,
    by_kind,
    isvc_container,
    one,
)
from tests.chart.rendered import env_of, mounts_of, pred, volumes_of

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


def test_the_startup_budget_covers_the_load_probe_and_the_load(render):
    """The default budget holds the probe's child at its deadline, then the server's own load.

    ``--load_probe`` (on for CUDA packages) loads the package once in a child
    before the server loads it: at worst ``--load_timeout_s``, and the server's
    load takes about as long again; the package's digest and the start of the
    process come on top (``docs/deployment.md``).
    """
    from predictor.config import ModelConfig

    c = isvc_container(render())
    budget_s = c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"]
    assert budget_s >= 2 * ModelConfig().load_timeout_s + 600


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


@pytest.mark.parametrize(
    ("values", "frontends", "queue", "batch"),
    [
        ({"server.frontends": 4}, 4, 1024, 32),
        ({"server.frontends": 2, "batching.maxQueueSize": 4096, "batching.maxBatchSize": 64},
         2, 4096, 64),
        ({"server.frontends": "auto", "resources.requests.cpu": "6"}, 5, 1024, 32),
    ],
)  # fmt: skip
def test_shm_holds_every_front_ends_slab_as_the_server_sizes_it(
    render, values, frontends, queue, batch
):
    """The server allocates each slab whole at start; a /dev/shm too small stops the pod."""
    from predictor.multiprocess.shm import layout_for

    limit = volumes_of(render(set_json=values))["dshm"]["emptyDir"]["sizeLimit"]
    assert limit.endswith("Mi")
    # H0-mini's tile and its 1536-float embedding, 2 CPU workers (the GPU's 1 needs less).
    levels = 2  # the server's --priority_levels default: a queue bound per class
    slab = layout_for(224, 0, 1536 * 8, 2 * (queue * levels + batch * 2)).slab_bytes
    assert int(limit[:-2]) * 2**20 >= 2 * 2**30 + frontends * slab
    assert int(limit[:-2]) * 2**20 < 2 * 2**30 + frontends * slab * 1.05  # not wasteful
    explicit = {**values, "shm.sizeLimit": "16Gi"}
    assert volumes_of(render(set_json=explicit))["dshm"]["emptyDir"]["sizeLimit"] == "16Gi"


def test_shm_holds_a_slab_per_model_with_each_entrys_batching(render):
    """With models:, a front end allocates one slab per model, sized from that model's batching."""
    from predictor.multiprocess.shm import layout_for

    values = {
        "server.frontends": 2,
        "batching.maxQueueSize": 2048,
        "models": [
            {"name": "h0-mini"},
            {
                "name": "small",
                "spec": "h0-mini",
                "batching": {"maxQueueSize": 256, "maxBatchSize": 8},
            },
        ],
    }
    limit = volumes_of(render(set_json=values))["dshm"]["emptyDir"]["sizeLimit"]
    slabs = sum(
        layout_for(224, 0, 1536 * 8, 2 * (queue * 2 + batch * 2)).slab_bytes
        for queue, batch in ((2048, 32), (256, 8))
    )
    assert int(limit[:-2]) * 2**20 >= 2 * 2**30 + 2 * slabs
    assert int(limit[:-2]) * 2**20 < 2 * 2**30 + 2 * slabs * 1.05
