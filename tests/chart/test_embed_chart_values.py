"""charts/histoserve-embed: the values schema, the templates' checks, docs and NOTES.

The schema is strict (unknown keys and bad values fail ``helm install`` with a
pointer to the value); what it cannot express the templates check with a
message naming the value (required values, inline manifests with relative
paths, impossible combinations).
"""

from __future__ import annotations

import pytest

from tests.chart.embed_helpers import (
    CHART,
    CI,
    NAMESPACE,
    RELEASE,
    REQUIRED_SETS,
    container,
    flags,
    refused,
    render,
    template,
)
from tests.chart.helpers import REPO, helm_notes, leaf_paths, load_yaml, one, parse_docs

# ------------------------------------------------------------------ schema and checks


def _args(*sets: str) -> tuple[str, ...]:
    """Required values, then the bad ones: all --set-json, which helm applies in order."""
    out: list[str] = []
    for s in REQUIRED_SETS:
        key, value = s.split("=", 1)
        out += ["--set-json", f'{key}="{value}"']
    for s in sets:
        out += ["--set-json", s]
    return tuple(out)


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("unknownTopLevel=1", "unknownTopLevel"),
        ("embed.batchsize=64", "batchsize"),
        ('slides.manifestFile="x.csv"', "manifestFile"),
        ('inferenceService.protocol="ftp"', "protocol"),
        ('inferenceService.deploymentMode="Serverless"', "deploymentMode"),
        ('inferenceService.url="h0-predictor:8080"', "url"),
        ("inferenceService.url=[]", "url"),
        ('inferenceService.name="H0_Bad"', "name"),
        ("completions=0", "completions"),
        ('completions="16"', "completions"),
        ("parallelism=0", "parallelism"),
        ("concurrency=0", "concurrency"),
        ("backoffLimitPerIndex=-1", "backoffLimitPerIndex"),
        ('podFailurePolicy.usageError="Ignore"', "usageError"),
        ('embed.mode="features"', "mode"),
        ("embed.minTissue=1.5", "minTissue"),
        ("embed.targetMpp=0", "targetMpp"),
        ('embed.progress="fancy"', "progress"),
        ('embed.extraArgs=["force"]', "extraArgs"),
        ('resources.limits={"nvidia.com/gpu": 1}', "nvidia.com/gpu"),
        ('resources.requests={"ephemeral-storage": "1Gi"}', "ephemeral-storage"),
        ('output.mountPath="relative/out"', "mountPath"),
        ('slides.pvc.subPath="../etc"', "subPath"),
        ('fullnameOverride="' + "a" * 53 + '"', "fullnameOverride"),
    ],
)
def test_schema_rejects_bad_values(helm_bin, bad, needle):
    err = refused(helm_bin, *_args(bad))
    assert "values don't meet the specifications of the schema" in err, err
    assert needle in err, err


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        ((), "inferenceService.name"),
        (("inferenceService.name=h0",), "slides.pvc.claimName"),
        (("inferenceService.name=h0", "slides.pvc.claimName=s"), "output.pvc.claimName"),
    ],
)
def test_required_values_fail_with_a_clear_message(helm_bin, sets, needle):
    args: list[str] = []
    for s in sets:
        args += ["--set", s]
    assert needle in refused(helm_bin, *args)


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("parallelism=32", "parallelism (32) > completions (16)"),
        ("maxFailedIndexes=17", "maxFailedIndexes (17) must be <= completions (16)"),
        ('slides.manifestPath=""', "slides.manifest"),
        ('output.mountPath="/slides"', "must differ"),
    ],
)
def test_template_checks_refuse_impossible_combinations(helm_bin, bad, needle):
    assert needle in refused(helm_bin, *_args(bad))


def test_oversized_manifest_refused(helm_bin, tmp_path):
    path = tmp_path / "huge.csv"
    path.write_text("slide_id,path\n" + "S,/slides/x.svs\n" * 80_000)
    err = refused(helm_bin, *_args(), "--set-file", f"slides.manifest={path}")
    assert "a ConfigMap holds at most 1 MiB" in err and "slides.manifestPath" in err


# ------------------------------------------------------------------ docs and NOTES


README_PASSTHROUGH = ("resources", "podSecurityContext", "securityContext")


def test_readme_documents_every_value_and_the_issue_names():
    readme = (CHART / "README.md").read_text()
    values = load_yaml((CHART / "values.yaml").read_text())
    missing = [p for p in leaf_paths(values, README_PASSTHROUGH) if f"| `{p}` |" not in readme]
    assert not missing, f"charts/histoserve-embed/README.md has no row for {missing}"
    for name in (
        "image",
        "slides",
        "output",
        "inferenceService",
        "completions",
        "parallelism",
        "backoffLimitPerIndex",
        "maxFailedIndexes",
        "concurrency",
        "resources",
    ):
        assert name in values, name


def notes(helm_bin: str, *args: str) -> str:
    return helm_notes(helm_bin, CHART, RELEASE, NAMESPACE, *args)


def test_notes_say_how_to_watch_progress(helm_bin):
    text = notes(helm_bin, "--values", str(CI / "path-manifest-values.yaml"))
    job = f"{RELEASE}-histoserve-embed"
    assert f"kubectl -n {NAMESPACE} get job {job} -w" in text
    assert "completedIndexes" in text and "failedIndexes" in text
    assert "/data/features/status.csv" in text
    assert 'histoserve_queue_depth{namespace="serving", pod=~"h-optimus-0-predictor-.*"}' in text
    assert "200 shards" in text and "16 pods" in text
    assert "fails the whole Job" in text


def test_chart_files_exist():
    for rel in ("Chart.yaml", "values.schema.json", "templates/NOTES.txt", ".helmignore"):
        assert (CHART / rel).is_file(), rel


@pytest.mark.parametrize(
    ("csv", "needle"),
    [
        (
            "slide_id,path,mpp\nA,/slides/a.svs,\nB,b.svs,0.25\n",
            'slides.manifest line 3: path "b.svs" is relative',
        ),
        (
            "slide_id,path,bulk_rna\r\nA,/slides/a.svs,rna/a.csv\r\n",
            'line 2: bulk_rna "rna/a.csv" is relative',
        ),
        (
            "slide_id,path,mask\nA,/slides/a.svs,masks/A.geojson\n",
            'line 2: mask "masks/A.geojson" is relative',
        ),
        ("id,file\nA,/slides/a.svs\n", "the first line must be the header slide_id,path"),
    ],
)
def test_inline_manifest_needs_absolute_paths(helm_bin, tmp_path, csv, needle):
    """The client resolves relative paths against the manifest's folder, a ConfigMap here."""
    path = tmp_path / "cohort.csv"
    path.write_bytes(csv.encode())
    err = refused(helm_bin, *_args(), "--set-file", f"slides.manifest={path}")
    assert needle in err, err


def test_ten_thousand_slides_fit_inline(helm_bin, tmp_path):
    rows = "".join(f"TCGA-{i:06d}-DX1,/slides/brca/TCGA-{i:06d}-DX1.svs\n" for i in range(10_000))
    path = tmp_path / "cohort.csv"
    path.write_text("slide_id,path\n" + rows)
    objs = render(helm_bin, None, set_files=(f"slides.manifest={path}",))
    assert one(objs, "ConfigMap")["data"]["slides.csv"].count("\n") == 10_001


def test_readme_install_line_renders(helm_bin, tmp_path):
    """The one `helm install` the README gives renders (its --set-file CSV made up here)."""
    readme = (REPO / "README.md").read_text()
    assert "(docs/cohorts.md)" in readme and (REPO / "docs" / "cohorts.md").is_file()
    (line,) = [x for x in readme.splitlines() if x.startswith("helm install ") and "-embed" in x]
    words = line.split()
    assert words[3] == "charts/histoserve-embed", words
    csv = tmp_path / "brca.csv"
    csv.write_text("slide_id,path\nS1,/slides/S1.svs\n")
    args: list[str] = []
    for flag, value in zip(words[4::2], words[5::2], strict=True):
        assert flag in ("--set", "--set-file"), flag
        if flag == "--set-file":
            value = f"{value.split('=', 1)[0]}={csv}"
        args += [flag, value]
    objs = parse_docs(template(helm_bin, tuple(args)))
    assert one(objs, "ConfigMap")["data"]["slides.csv"] == csv.read_text()
    assert flags(container(objs))["url"] == [
        "http://h0-histoserve-predictor.cohorts.svc.cluster.local"
    ]
