"""Chart README documents every value; NOTES.txt renders the endpoint and V2 examples."""

from __future__ import annotations

from tests.chart.helpers import CHART, PREDICTOR, helm_notes, leaf_paths, load_yaml, preset_files

README = (CHART / "README.md").read_text()
VALUES = load_yaml((CHART / "values.yaml").read_text())
# Kubernetes objects passed through whole: documented as one row.
PASSTHROUGH = {
    "resources",
    "podSecurityContext",
    "securityContext",
    "tests.resources",
    "metrics.dashboard.labels",
}


def test_readme_documents_every_value():
    paths = sorted(leaf_paths(VALUES, PASSTHROUGH))
    assert len(paths) > 100
    undocumented = [p for p in paths if f"| `{p}` |" not in README]
    assert not undocumented, f"charts/histoserve/README.md has no row for {undocumented}"


def test_readme_links_every_preset_and_states_versions():
    for preset in preset_files():
        name = preset.rsplit("/", 1)[-1]
        assert f"presets/{name}" in README, name
    for needle in ("KServe | **0.16+**", "KServe | **0.17+**", "Kubernetes | **1.30+**"):
        assert needle in README


def notes(helm_bin, *args):
    return helm_notes(helm_bin, CHART, "hs", "histo", *args)


def test_notes_show_endpoint_rest_and_grpc_examples(helm_bin):
    text = notes(helm_bin)
    assert f"http://{PREDICTOR}.histo.svc" in text
    assert f"{PREDICTOR}.histo.svc:8081" in text
    assert "curl" in text and "/v2/models/h0-mini/infer" in text
    assert '"datatype": "UINT8", "shape": [1, 224, 224, 3]' in text
    assert "grpcurl" in text and "inference.GRPCInferenceService/ModelReady" in text
    assert "helm test hs" in text


def test_notes_follow_the_values(helm_bin):
    text = notes(helm_bin, "--set", "deploymentMode=Knative", "--set", "kserveBatcher.enabled=true")
    assert f"http://{PREDICTOR}.histo.svc.cluster.local" in text
    assert "V1" in text and "agent batcher" in text
    text = notes(helm_bin, "--set", "model.spec=tissue-seg", "--set", "model.name=seg")
    assert "[1, 512, 512, 3]" in text and "/v2/models/seg/infer" in text
