"""charts/histoserve-embed: lint, render, strict validation, the pod's command line.

Runs the real ``helm`` binary (no cluster) over every ``ci/`` values file and
validates every rendered object with kubernetes-validate in strict mode against
the oldest supported and the newest Kubernetes (the ``validate_object`` fixture
shared with the server chart's tests).
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.chart.embed_helpers import (
    CHART,
    CI,
    NAMESPACE,
    ci_values,
    container,
    flags,
    pod_spec,
    render,
)
from tests.chart.helpers import one

MATRIX = sorted(p.name for p in CI.glob("*.yaml"))
REQUIRED_CASES = {
    "configmap-manifest-values.yaml",
    "path-manifest-values.yaml",
    "explicit-url-values.yaml",
    "knative-derived-url-values.yaml",
    "standard-grpc-values.yaml",
    "knative-grpc-values.yaml",
    "full-values.yaml",
}


# ------------------------------------------------------------------ lint, validate


def test_matrix_covers_required_cases():
    assert set(MATRIX) >= REQUIRED_CASES, sorted(REQUIRED_CASES - set(MATRIX))


@pytest.mark.parametrize("values", MATRIX)
def test_lint_strict(helm_bin, values):
    proc = subprocess.run(
        [helm_bin, "lint", "--strict", str(CHART), "--values", str(CI / values)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("values", [None, *MATRIX])
def test_every_rendered_object_validates(helm_bin, validate_object, values):
    objs = render(helm_bin, values)
    kinds = sorted(o["kind"] for o in objs)
    manifest_inline = bool((ci_values(values) if values else {}).get("slides", {}).get("manifest"))
    assert kinds == (["ConfigMap", "Job"] if manifest_inline else ["Job"]), kinds
    for obj in objs:
        assert obj["metadata"]["namespace"] == NAMESPACE
        validate_object(obj)


@pytest.mark.parametrize("values", [None, *MATRIX])
def test_pod_is_consistent(helm_bin, values):
    """What the schema cannot see: mounts name volumes, the manifest and --out are mounted."""
    objs = render(helm_bin, values)
    spec, c = pod_spec(objs), container(objs)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert len(volumes) == len(spec["volumes"]), "duplicate volume names"
    for m in c["volumeMounts"]:
        assert m["name"] in volumes, f"mount {m} names no volume"
    f = flags(c)
    (out,) = f["out"]
    assert volumes[mounts[out]["name"]]["persistentVolumeClaim"]["claimName"]
    assert not mounts[out].get("readOnly")
    (manifest,) = f["manifest"]
    holder = max((p for p in mounts if manifest.startswith(p.rstrip("/") + "/")), key=len)
    assert mounts[holder]["readOnly"] is True
    assert c["workingDir"] in mounts


# ------------------------------------------------------------------ the command line


EXPECTED_URLS = {
    None: ["http://h0-histoserve-predictor.cohorts.svc.cluster.local"],
    "configmap-manifest-values.yaml": ["http://h0-histoserve-predictor.cohorts.svc.cluster.local"],
    "path-manifest-values.yaml": ["http://h-optimus-0-predictor.serving.svc.cluster.local"],
    "explicit-url-values.yaml": [
        "http://h0-a100-predictor.serving.svc.cluster.local",
        "http://h0-h100-predictor.serving.svc.cluster.local",
    ],
    "knative-derived-url-values.yaml": ["http://h0-histoserve-predictor.ml.svc.corp.internal"],
    "standard-grpc-values.yaml": ["grpc://h0-histoserve-predictor.cohorts.svc.cluster.local:8081"],
    "knative-grpc-values.yaml": ["grpc://h0-histoserve-predictor.cohorts.svc.cluster.local:80"],
    "full-values.yaml": ["http://m-optimus-histoserve-predictor.serving.svc.cluster.local"],
}


@pytest.mark.parametrize("values", list(EXPECTED_URLS))
def test_urls_follow_kserve_service_naming(helm_bin, values):
    assert flags(container(render(helm_bin, values)))["url"] == EXPECTED_URLS[values]


def test_every_ci_file_has_an_expected_url():
    assert set(MATRIX) <= set(EXPECTED_URLS)


def test_single_explicit_url_string(helm_bin):
    objs = render(helm_bin, None, 'inferenceService.url="grpc://10.0.0.7:9000"')
    assert flags(container(objs))["url"] == ["grpc://10.0.0.7:9000"]


@pytest.mark.parametrize("values", [None, *MATRIX])
def test_shard_is_the_completion_index(helm_bin, values):
    """--shard $(JOB_COMPLETION_INDEX)/completions, expanded by the kubelet from the env."""
    objs = render(helm_bin, values)
    job, c = one(objs, "Job"), container(objs)
    completions = job["spec"]["completions"]
    assert flags(c)["shard"] == [f"$(JOB_COMPLETION_INDEX)/{completions}"]
    env = {e["name"]: e for e in c["env"]}
    assert env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    # The kubelet expands $(VAR) only for variables declared before use in env order;
    # args may use any of them, but nothing else may reference an undeclared one.
    assert "$(" not in " ".join(c["command"])
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["parallelism"] <= completions


def test_default_command_line(helm_bin):
    c = container(render(helm_bin))
    assert c["args"] == [
        "embed",
        "--manifest=/slides/manifest.csv",
        "--url=http://h0-histoserve-predictor.cohorts.svc.cluster.local",
        "--out=/output",
        "--shard=$(JOB_COMPLETION_INDEX)/16",
        "--concurrency=8",
        "--progress=plain",
    ]


def test_full_command_line(helm_bin):
    f = flags(container(render(helm_bin, "full-values.yaml")))
    assert f == {
        "manifest": ["/etc/histoserve-embed/slides.csv"],
        "url": ["http://m-optimus-histoserve-predictor.serving.svc.cluster.local"],
        "out": ["/output"],
        "shard": ["$(JOB_COMPLETION_INDEX)/64"],
        "concurrency": ["12"],
        "model": ["m-optimus"],
        "mode": ["prediction_with_embedding"],
        "target-mpp": ["0.5"],
        "mpp-override": ["0.25"],
        "mpp-tolerance": ["0.1", "0.08"],
        "tissue": ["tissue-seg"],
        "min-tissue": ["0.4"],
        "slide-model": ["abmil-brca"],
        "slide-url": ["http://abmil-brca-predictor.serving.svc.cluster.local"],
        "batch-size": ["128"],
        "read-workers": ["6"],
        "force": [""],
        "progress": ["none"],
    }


def test_manifest_path_resolves_against_the_slides_mount(helm_bin):
    f = flags(container(render(helm_bin, "path-manifest-values.yaml")))
    assert f["manifest"] == ["/data/slides/cohorts/brca-2026.csv"]
    assert f["out"] == ["/data/features"]
    assert f["concurrency"] == ["4"] and f["model"] == ["h-optimus-0"]
    f = flags(container(render(helm_bin, "explicit-url-values.yaml")))
    assert f["manifest"] == ["/slides/manifest.csv"]


def test_manifest_configmap_carries_the_csv_verbatim(helm_bin, tmp_path):
    csv = "slide_id,path\n" + "".join(f"S{i:05d},/slides/s{i}.svs\n" for i in range(500))
    path = tmp_path / "cohort.csv"
    path.write_text(csv)
    objs = render(helm_bin, None, set_files=(f"slides.manifest={path}",))
    cm = one(objs, "ConfigMap")
    assert cm["data"] == {"slides.csv": csv}
    spec, c = pod_spec(objs), container(objs)
    (vol,) = [v for v in spec["volumes"] if "configMap" in v]
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
    (item,) = vol["configMap"]["items"]
    assert flags(c)["manifest"] == [f"{mount['mountPath']}/{item['path']}"]
    annotations = one(objs, "Job")["spec"]["template"]["metadata"]["annotations"]
    assert len(annotations["checksum/manifest"]) == 16


# ------------------------------------------------------------------ Job policy


@pytest.mark.parametrize("values", [None, *MATRIX])
def test_failure_policy(helm_bin, values):
    objs = render(helm_bin, values)
    spec = one(objs, "Job")["spec"]
    cfg = ci_values(values) if values else {}
    pfp = cfg.get("podFailurePolicy", {})
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["backoffLimitPerIndex"] == cfg.get("backoffLimitPerIndex", 2)
    assert spec.get("maxFailedIndexes") == cfg.get("maxFailedIndexes")
    rules = spec["podFailurePolicy"]["rules"]
    exit2 = rules[0]
    assert exit2["action"] == pfp.get("usageError", "FailJob")
    assert exit2["onExitCodes"] == {
        "containerName": container(objs)["name"],
        "operator": "In",
        "values": [2],
    }
    disruption = {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert (disruption in rules) is pfp.get("ignoreDisruptions", True)
    assert spec.get("ttlSecondsAfterFinished") == cfg.get("ttlSecondsAfterFinished", 604800)


@pytest.mark.parametrize("values", [None, *MATRIX])
def test_restricted_security_and_cpu_only_resources(helm_bin, values):
    """Pod Security Standard "restricted", read-only root with /tmp, no GPU requested."""
    objs = render(helm_bin, values)
    spec, c = pod_spec(objs), container(objs)
    psc, sc = spec["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False
    assert all(v.get("hostPath") is None for v in spec["volumes"])
    tmp = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}["/tmp"]
    assert "emptyDir" in {v["name"]: v for v in spec["volumes"]}[tmp]
    slides = {v["name"]: v for v in spec["volumes"]}["slides"]["persistentVolumeClaim"]
    assert slides["readOnly"] is True
    for part in ("requests", "limits"):
        assert set(c["resources"].get(part, {})) <= {"cpu", "memory"}


@pytest.mark.parametrize("values", [None, *MATRIX])
def test_rendered_args_are_what_the_cli_accepts(helm_bin, values):
    """The real `histoserve embed` parser and config checks take every rendered command line."""
    from histoserve.commands.embed import build_parser, config_from_args

    job = one(render(helm_bin, values), "Job")
    c = container([job])
    completions = job["spec"]["completions"]
    for index in (0, completions - 1):
        args = [a.replace("$(JOB_COMPLETION_INDEX)", str(index)) for a in c["args"][1:]]
        config = config_from_args(build_parser().parse_args(args), {})
        assert config.shard == (index, completions)
        assert list(config.urls) == flags(c)["url"]
        assert config.concurrency == job_values(values).get("concurrency", 8)


def job_values(values: str | None) -> dict[str, Any]:
    return ci_values(values) if values else {}


def test_embed_pods_carry_the_labels_the_server_network_policy_admits(helm_bin):
    """``networkPolicy.allowEmbedJobs`` in charts/histoserve selects exactly these labels."""
    objs = render(helm_bin, None, 'nameOverride="renamed"')
    (job,) = [o for o in objs if o["kind"] == "Job"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/part-of"] == "histoserve"
    assert labels["app.kubernetes.io/component"] == "embed"
