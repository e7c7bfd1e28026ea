"""The user docs' commands work as written: each one runs here, or is rendered, or says why not.

:data:`REGISTRY` is keyed by each command's exact text as
:func:`harness.docs.doc_commands` extracts it from ``README.md``, ``docs/*.md``
and ``charts/*/README.md`` (a ``python`` block is one command; a shell block
one per command line, continuations joined with one space, comments
dropped). :func:`test_the_registry_is_the_docs` fails when the two differ: a
command changed in the docs without its test, or a test left for a command
the docs no longer have. Each entry is one of:

- ``run``: the command runs as written in a reader's folder
  (:class:`harness.docs_session.DocsSession`: the checkout's ``.venv``,
  ``charts`` and ``manifests`` linked in) against ``make serve`` started from
  the checkout (the recipe itself: its export, then the server, on loopback).
  The only edits: the ports 8080/8081 become free ports, the placeholder host
  ``h0`` of ``docs/cohorts.md`` becomes ``localhost``, and ``--module
  mypkg.models:build`` finds ``mypkg`` on ``PYTHONPATH`` (as an installed
  package would be). The three exports (two here, one in ``make serve``) run
  at once in the background from the module's start;
- ``render``: a command for a cluster (``helm install``, ``helm test``,
  ``kubectl``) is rendered instead, ``helm template`` with the very same
  arguments, and every object validated as ``tests/chart`` does (KServe CRDs,
  strict Kubernetes schemas);
- ``static``: a command that can never run here, with the reason (``why``),
  and what can be checked here (its flags parse, the Dockerfile takes the
  argument).

To add a command: print the docs' commands (``.venv/bin/python -c 'from
harness.docs import doc_commands; print(*doc_commands(), sep="\\n\\n")'``), copy
the new one as a key below, and give it an :class:`Entry`.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from collections.abc import Iterator

import httpx
import pytest

from harness.docs import Block, block_language, doc_commands, shell_commands
from harness.docs_session import DocsSession
from harness.listeners import is_loopback, listening_addresses
from tests.integration.docs_checks import (
    Entry,
    client_example,
    cluster_embed,
    cohort_workflow,
    curl_example,
    dockerfile_arg,
    dockerfile_server,
    dockerfile_target,
    embed_readme,
    exported,
    flags_parse,
    helm_test,
    isvc_named,
    job_in,
    job_named,
    json_bodies,
    kubectl_apply,
    my_model,
    notebook_embed,
    package_set_source,
    pod_command,
    prepare,
    ray_api,
    triton_example,
)
from tests.integration.docs_checks import chart as render_chart

pytestmark = pytest.mark.integration

# -- the registry ---------------------------------------------------------------------------
README_INSTALL = (
    "helm install h0 charts/histoserve -n histo --set storage.pvc.existingClaim=histo-models"
)
CHART_README_INSTALL = "helm install h0 charts/histoserve --namespace histo --create-namespace --set storage.pvc.existingClaim=histo-models -f charts/histoserve/presets/keda-queue-depth.yaml"
EMBED_README_INSTALL = "helm install brca charts/histoserve-embed -n pathology --set inferenceService.name=h0-histoserve --set slides.pvc.claimName=wsi --set output.pvc.claimName=features --set-file slides.manifest=cohort.csv"
COHORTS_EMBED_INSTALL = "helm install brca charts/histoserve-embed -n pathology --set inferenceService.name=h0-histoserve --set slides.pvc.claimName=wsi --set output.pvc.claimName=features --set-file slides.manifest=brca.csv"
JSON_BODIES = """.venv/bin/python -c 'import base64, json, sys; t = base64.b64encode(open(sys.argv[1], "rb").read()).decode()
json.dump({"inputs": [{"name": "tiles", "shape": [1], "datatype": "BYTES", "data": [t]}]}, open("v2.json", "w"))
json.dump({"instances": [{"image_data": t, "slide_name": "S1", "x": 0, "y": 0}]}, open("v1.json", "w"))' tile.png"""
COHORT_FIRST = "histoserve embed --manifest brca.csv --url http://h0:8080 --out features/brca-h0"
COHORT_COPY = "cp features/brca-h0/qc/*.geojson masks/"
COHORT_MASKED = (
    "histoserve embed --manifest brca.csv --url http://h0:8080 --out features/brca-h0 --masks masks"
)
MODULE_EXPORT = "histoserve export --spec h0 --module mypkg.models:build --output h0.pt2"
EMBED = "histoserve.commands.embed"
AGGREGATE = "histoserve.commands.aggregate"


def slurm_task(module: str):  # -> a registry check
    """Its flags parse, and array task 17 takes shard 17 of 400 from ``$SLURM_ARRAY_TASK_ID``."""

    def check(session: DocsSession, command: str) -> None:
        import importlib
        import shlex

        from histoserve.slides.manifest import parse_shard

        words = shlex.split(command)[2:]
        args = importlib.import_module(module).build_parser().parse_args(words)
        assert parse_shard(args.shard, {"SLURM_ARRAY_TASK_ID": "17"}) == (17, 400)

    return check


COHORT = cohort_workflow(COHORT_FIRST, COHORT_COPY, COHORT_MASKED)
NO_DOCKER = (
    "no Docker engine here (the Dockerfile is checked statically: tests/chart/test_dockerfile.py)"
)

CLIENT_BLOCK = """import io
import numpy as np
from PIL import Image
from histoserve import HistoserveClient

tiles = np.random.randint(0, 256, (32, 224, 224, 3), dtype=np.uint8)
Image.fromarray(tiles[0]).save(buf := io.BytesIO(), "PNG")
png_bytes = buf.getvalue()

with HistoserveClient("http://localhost:8080", "h0-mini") as client:
    emb = client.infer_pixels(tiles)["embedding"]  # float32 [32, 1536]
    emb2 = client.infer_images([png_bytes])["embedding"]  # encoded PNG/JPEG/TIFF tiles"""
TRITON_BLOCK = """import tritonclient.grpc as grpcclient

client = grpcclient.InferenceServerClient("localhost:8081")
inp = grpcclient.InferInput("pixels", list(tiles.shape), "UINT8")
inp.set_data_from_numpy(tiles)
emb = client.infer("h0-mini", [inp]).as_numpy("embedding")"""
NOTEBOOK_BLOCK = """import histoserve

summary = histoserve.embed(["slides/A.svs"], url="http://localhost:8080", out="features/")
slide = histoserve.read_features("features/A.h5")  # .features [N, 1536], .coords [N, 2], .attrs"""
MY_MODEL_BLOCK = """from predictor import BaseServerModel, ModelRequest, PreparedSample


class MyModel(BaseServerModel):
    def prepare_sample(self, request: ModelRequest) -> PreparedSample: ...  # HWC or CHW uint8
    def forward_batch(self, samples, requests, mode="prediction"): ...  # call super()"""
RAY_BLOCK = """import histoserve
import ray
from ray.util import ActorPool


@ray.remote(num_cpus=8)
class Embedder:
    def __init__(self, urls: tuple[str, ...], out_dir: str) -> None:
        self.urls, self.out_dir = urls, out_dir

    def run(self, slide: str) -> tuple[list[str], list[str]]:
        summary = histoserve.embed(slide, url=self.urls, out=self.out_dir, progress="none")
        return list(summary.done) + list(summary.skipped), list(summary.failed)


pool = ActorPool(
    [
        Embedder.remote(
            ("http://h0-histoserve-predictor.pathology.svc.cluster.local",), "/mnt/features/brca-h0"
        )
        for _ in range(12)
    ]
)
results = list(pool.map_unordered(lambda a, s: a.run.remote(s), slide_paths))"""

CLUSTER_URL = "the cluster's Service URL (the same command runs below on localhost)"
NO_TIMM = "timm imports torchvision, which fails beside the CPU torch here; H0's weights are gated"
SLURM = "a Slurm array task: its cluster's /lustre paths and GPU hosts"
OTEL_COLLECTOR = (
    "a cluster's OTLP collector (traces to a loopback receiver: tests/integration/test_tracing.py)"
)
NO_RAY = "Ray is not installed here, and the URL is a cluster's"

ONE_SERVER = (
    "the demo tissue-seg has random weights (it finds no tissue: every slide fails its head); "
    "tests/integration/test_embed_one_server.py runs this command against one server of "
    "h0-mini, a tissue-seg that segments and abmil-demo, and compares it with three servers"
)
SERVES_THREE = (
    "it exports three demo packages (minutes) and serves until stopped; run once by hand: "
    "its repository index lists h0-mini, tissue-seg and abmil-demo READY"
)
ONE_CLUSTER_URL = "the cluster's Service URL (one local server: test_embed_one_server.py)"
MODELS_INSTALL = (
    "helm install h0 charts/histoserve -n histo -f charts/histoserve/ci/models-values.yaml"
)


def serves_folders(session: DocsSession, command: str) -> None:
    """``make serve MODELS=...``: its recipe exports each into its own folder and serves them."""
    import shlex

    from tests.chart.helpers import REPO

    models = shlex.split(command)[2].split("=", 1)[1].split()
    assert models == ["h0-mini", "tissue-seg", "abmil-demo"]
    recipe = (REPO / "Makefile").read_text()
    assert "--output $(REPOSITORY_DIR)/$$m/$$m.pt2" in recipe
    assert "--model_dir $(REPOSITORY_DIR) --models $(shell echo $(MODELS) | tr ' ' ,)" in recipe


def embeds_one_url(session: DocsSession, command: str) -> None:
    """Its flags parse; no --model, --tissue-url or --slide-url: one URL for all three."""
    import shlex

    words = shlex.split(command)[2:]
    args = importlib.import_module(EMBED).build_parser().parse_args(words)
    assert len(args.url) == 1 and args.tissue == "tissue-seg" and args.slide_model == "abmil-demo"
    assert not ({"--model", "--tissue-url", "--slide-url"} & set(words))


def two_models_served(objs: list[dict]) -> None:
    """The release serves the folders with their settings (tests/chart/test_chart_values_models.py)."""
    isvc_named("h0-histoserve", "histo")(objs)
    (pred,) = [o["spec"]["predictor"] for o in objs if o["kind"] == "InferenceService"]
    (server,) = [c for c in pred["containers"] if c["name"] == "kserve-container"]
    assert "--models=h0-mini,tissue-seg,abmil-demo" in server["args"]
    assert "--model_settings=/etc/histoserve/models" in server["args"]


REGISTRY: dict[str, Entry] = {
    # README.md
    README_INSTALL: Entry("render", render_chart(isvc_named("h0-histoserve", "histo"))),
    "histoserve embed slides/*.svs --url http://h0-histoserve-predictor.histo.svc.cluster.local --out features/": Entry(
        "static", cluster_embed(README_INSTALL), why=CLUSTER_URL
    ),
    CLIENT_BLOCK: Entry("run", client_example),
    TRITON_BLOCK: Entry("run", triton_example(CLIENT_BLOCK)),
    JSON_BODIES: Entry("run", json_bodies),
    "curl -s localhost:8080/v2/models/h0-mini/infer -H 'content-type: application/json' -d @v2.json | head -c 300": Entry(
        "run", curl_example('{"model_name":"h0-mini"', JSON_BODIES)
    ),
    "curl -s localhost:8080/v1/models/h0-mini:predict -H 'content-type: application/json' -d @v1.json | head -c 300": Entry(
        "run", curl_example('{"predictions":[', JSON_BODIES)
    ),
    "histoserve embed slides/*.svs --url http://localhost:8080 --out features/": Entry(
        "run", embed_readme
    ),
    'make serve MODELS="h0-mini tissue-seg abmil-demo"': Entry(
        "static", serves_folders, why=SERVES_THREE
    ),
    "histoserve embed slides/*.svs --url http://localhost:8080 --tissue tissue-seg --slide-model abmil-demo --out features/": Entry(
        "static", embeds_one_url, why=ONE_SERVER
    ),
    NOTEBOOK_BLOCK: Entry("run", notebook_embed),
    "histoserve export --spec h0-mini --demo --output model/h0-mini.pt2": Entry(
        "run", exported("model/h0-mini.pt2"), background=True
    ),
    MODULE_EXPORT: Entry("run", exported("h0.pt2"), background=True),
    "histoserve export --spec h0 --timm vit_giant_patch14_reg4_dinov2 --weights h0.safetensors --output h0.pt2": Entry(
        "static", flags_parse("predictor.export.build", 2), why=NO_TIMM
    ),
    MY_MODEL_BLOCK: Entry("run", my_model),
    "helm install brca charts/histoserve-embed --set inferenceService.name=h0-histoserve --set slides.pvc.claimName=wsi --set output.pvc.claimName=features --set-file slides.manifest=brca.csv": Entry(
        "render", render_chart(job_in("default"))
    ),
    # charts/histoserve/README.md, docs/deployment.md
    CHART_README_INSTALL: Entry("render", render_chart(isvc_named("h0-histoserve", "histo"))),
    "helm test h0 -n histo --logs": Entry("render", helm_test(CHART_README_INSTALL)),
    # charts/histoserve-embed/README.md
    EMBED_README_INSTALL: Entry("render", render_chart(job_in("pathology"))),
    "histoserve embed --manifest=/etc/histoserve-embed/slides.csv --url=http://h0-histoserve-predictor.pathology.svc.cluster.local --out=/output --shard=$(JOB_COMPLETION_INDEX)/16 --concurrency=8 --progress=plain": Entry(
        "render", pod_command(EMBED_README_INSTALL)
    ),
    # docs/cohorts.md
    "helm install h0 charts/histoserve -n pathology -f charts/histoserve/presets/keda-queue-depth.yaml --set model.name=h-optimus-0 --set storage.pvc.existingClaim=models --set batching.maxBatchSize=64 --set batching.maxQueueSize=2048": Entry(
        "render", render_chart(isvc_named("h0-histoserve", "pathology"))
    ),
    COHORTS_EMBED_INSTALL: Entry("render", render_chart(job_in("pathology"))),
    "kubectl -n pathology get job brca-histoserve-embed -w": Entry(
        "render", job_named(COHORTS_EMBED_INSTALL)
    ),
    COHORT_FIRST: Entry("run", COHORT, folder="cohort"),
    COHORT_COPY: Entry("run", COHORT, folder="cohort"),
    COHORT_MASKED: Entry("run", COHORT, folder="cohort"),
    "histoserve embed --manifest /lustre/cohorts/brca.csv --shard 400 --url http://gpu-a:8080 --url http://gpu-b:8080 --out /lustre/features/brca-h0 --concurrency 4 --batch-size 32 --progress plain --slide-model abmil-brca": Entry(
        "static", slurm_task(EMBED), why=SLURM
    ),
    "histoserve aggregate /lustre/features/brca-h0 --url http://gpu-a:8080 --model abmil-brca --shard 400": Entry(
        "static", slurm_task(AGGREGATE), why=SLURM
    ),
    RAY_BLOCK: Entry("static", ray_api, why=NO_RAY),
    # docs/deployment.md
    "histoserve embed --manifest brca.csv --url http://h0-histoserve-predictor.histo.svc.cluster.local --tissue tissue-seg --slide-model abmil-demo --out features/brca-h0": Entry(
        "static", embeds_one_url, why=ONE_CLUSTER_URL
    ),
    MODELS_INSTALL: Entry("render", render_chart(two_models_served)),
    "python -m predictor --model_dir /models --otel_endpoint http://otel-collector:4318": Entry(
        "static", flags_parse("predictor.cli", 3), why=OTEL_COLLECTOR
    ),
    "python -m predictor --model_dir /models --otel_endpoint http://otel-collector:4317 --otel_protocol grpc --otel_sample_ratio 0.1": Entry(
        "static", flags_parse("predictor.cli", 3), why=OTEL_COLLECTOR
    ),
    "docker build -t registry.example.com/histoserve:0.1.0 .": Entry(
        "static", dockerfile_server, why=NO_DOCKER
    ),
    "docker build --build-arg BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime@sha256:<digest> -t registry.example.com/histoserve:0.1.0 .": Entry(
        "static", dockerfile_arg, why=NO_DOCKER
    ),
    "docker push registry.example.com/histoserve:0.1.0": Entry(
        "static", dockerfile_server, why=NO_DOCKER
    ),
    "docker build --target export -t registry.example.com/histoserve:0.1.0-export .": Entry(
        "static", dockerfile_target, why=NO_DOCKER
    ),
    "docker push registry.example.com/histoserve:0.1.0-export": Entry(
        "static", dockerfile_target, why=NO_DOCKER
    ),
    "helm install h0 charts/histoserve -n histo --create-namespace --set image.repository=registry.example.com/histoserve --set image.tag=0.1.0 --set storage.pvc.existingClaim=histo-models --set gpu.product=NVIDIA-H100-80GB-HBM3 -f charts/histoserve/presets/keda-queue-depth.yaml": Entry(
        "render", render_chart(isvc_named("h0-histoserve", "histo"))
    ),
    "histoserve export --spec h0 --timm vit_giant_patch14_reg4_dinov2 --weights /models/h0/h0.safetensors --dtype bf16 --device cuda --package_set /models/h0 --if_missing": Entry(
        "static", flags_parse("predictor.export.build", 2), why=f"a GPU export; {NO_TIMM}"
    ),
    "helm install h0 charts/histoserve -n histo --set storage.storageUri=oci://registry.example.com/histo/h0-packages:2026.12": Entry(
        "render", render_chart(package_set_source(False, "/mnt/models"))
    ),
    "helm install h0 charts/histoserve -n histo --set storage.pvc.existingClaim=histo-models --set model.spec=h0 --set model.build.enabled=true --set model.build.timm=vit_giant_patch14_reg4_dinov2 --set model.build.weights=h0.safetensors --set model.build.dtype=bf16": Entry(
        "render", render_chart(package_set_source(True, "/opt/ml/model"))
    ),
    "kubectl apply -f manifests/cluster-serving-runtime.yaml": Entry("render", kubectl_apply),
    "kubectl -n histo apply -f manifests/service-account.yaml -f manifests/persistent-volume-claim.yaml -f manifests/inference-service.yaml": Entry(
        "render", kubectl_apply
    ),
}
BACKGROUND_ENV = {MODULE_EXPORT: "PYTHONPATH"}
"""Background commands given the reader's folder in this variable (``mypkg`` importable)."""


# -- the tests ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsSession]:
    """The reader's folders, ``make serve`` and the exports started at once (they compile)."""
    session = DocsSession(tmp_path_factory.mktemp("docs"))
    try:
        session.make_serve(session.root / "make-serve-model")
        prepare(session)
        for command, entry in REGISTRY.items():
            if entry.background:
                folder = session.folder(entry.folder)
                env = {BACKGROUND_ENV[command]: str(folder)} if command in BACKGROUND_ENV else {}
                session.start(command, session.local(command), folder, env)
        yield session
    finally:
        session.close()


def _order(command: str) -> int:
    """Renders and static checks first (the exports compile meanwhile), the exports last."""
    entry = REGISTRY[command]
    return 0 if entry.how != "run" else 2 if entry.background else 1


def _id(command: str) -> str:
    """``README.md:42-import-io``: where the command is, and how it starts."""
    found = doc_commands().get(command)
    where = found.sources[0] if found else "not-in-docs"
    return f"{where}-" + re.sub(r"\W+", "-", command.splitlines()[0])[:50].strip("-")


def test_the_registry_is_the_docs() -> None:
    """Every docs command has an entry and every entry a docs command (see the module docstring)."""
    docs, registry = set(doc_commands()), set(REGISTRY)
    assert not docs - registry, (
        f"docs commands without a test (add them to REGISTRY): {sorted(docs - registry)}"
    )
    assert not registry - docs, f"REGISTRY entries no longer in the docs: {sorted(registry - docs)}"
    assert all(e.how in ("run", "render", "static") for e in REGISTRY.values())
    assert all(bool(e.why) == (e.how == "static") for e in REGISTRY.values())


def test_commands_are_read_as_the_shell_reads_them() -> None:
    """Continuations joined, comments dropped, quoted newlines kept; diagrams are no commands."""
    body = "helm a \\\n  --set b=1   # note\n# a comment line\npython -c 'x\ny' f.png\n"
    assert shell_commands(body) == ["helm a --set b=1", "python -c 'x\ny' f.png"]
    assert block_language(Block("", "x.md:1", "client ──► server")) is None
    assert block_language(Block("", "x.md:1", "histoserve embed --out=/o")) == "shell"
    assert block_language(Block("yaml", "x.md:1", "storage: {}")) is None


@pytest.mark.parametrize("command", sorted(REGISTRY, key=_order), ids=_id)
def test_docs_command(docs: DocsSession, command: str) -> None:
    """The command runs as written (ports local), renders and validates, or is checked statically."""
    REGISTRY[command].check(docs, command)


def test_make_serve_exports_then_serves_on_loopback_only(docs: DocsSession) -> None:
    """The recipe's own export made the package it serves; both ports answer this host only."""
    server = docs.serving()
    package = docs.root / "make-serve-model" / "h0-mini.pt2"
    assert package.is_file() and (package.parent / "h0-mini.pt2.sha256").is_file()
    config = httpx.get(f"{server.base}/v2/models/h0-mini/config", timeout=10).json()
    assert config["package_sha256"] == hashlib.sha256(package.read_bytes()).hexdigest()
    for port in (docs.http_port, docs.grpc_port):
        addresses = listening_addresses(port)
        assert addresses and all(map(is_loopback, addresses)), (port, addresses)
