"""How each docs command is checked, for ``test_docs_commands.py`` (its registry names these).

A check takes the session and the command's exact text: ``run`` checks run
the text (ports made local) and look at what it wrote; ``render`` checks turn
``helm install`` into ``helm template`` with the same arguments and validate
every object as ``tests/chart`` does (:func:`tests.chart.validators.check_object`);
``static`` checks look at what can be seen here of a command that cannot run.
A check that needs another command's result first (the curl calls need the
JSON bodies, the mask workflow its first run) runs that one when it has not.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import functools
import hashlib
import importlib
import json
import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from harness import slides
from harness.docs_session import REPO, DocsSession
from tests.chart.helpers import args_of, find_helm, isvc_container, missing, parse_docs
from tests.chart.validators import check_object, load_crd_validators

Check = Callable[[DocsSession, str], None]
Objects = tuple[dict, ...]
HOOK = "helm.sh/hook"


@dataclass(frozen=True)
class Entry:
    """How one command is checked: ``how`` is ``run``, ``render`` or ``static`` (with ``why``).

    ``folder`` is the reader's folder it runs in; ``background`` commands start
    with the module (the exports compile for tens of seconds) and ``check``
    waits for them.
    """

    how: str
    check: Check
    folder: str = "readme"
    why: str = ""
    background: bool = False


# -- the folders the commands run in ------------------------------------------------------
MODULE_FACTORY = '''"""A user's model: 14x14 patches, mean-pooled, projected to H0's 1536 features."""
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.patches, self.head = nn.Conv2d(3, 16, 14, stride=14), nn.Linear(16, 1536)

    def forward(self, tiles):
        return self.head(self.patches(tiles).mean(dim=(2, 3)))


def build():
    return Encoder()
'''


def prepare(session: DocsSession) -> None:
    """What the docs assume a reader has: a tile, slides, manifests, a model factory."""
    readme = session.folder("readme")
    Image.fromarray(slides.he_tile()[:224, :224]).save(readme / "tile.png")
    for name in ("A", "B"):
        slides.aperio_svs(readme / "slides" / f"{name}.svs")
    (readme / "mypkg").mkdir()
    (readme / "mypkg" / "__init__.py").write_text("")
    (readme / "mypkg" / "models.py").write_text(MODULE_FACTORY)
    cohort = session.folder("cohort")
    for name in ("S1", "S17"):
        slides.aperio_svs(cohort / "slides" / f"{name}.svs")
    (cohort / "brca.csv").write_text("slide_id,path\nS1,slides/S1.svs\nS17,slides/S17.svs\n")
    (cohort / "masks").mkdir()  # where the reader exported S17's mask from QuPath
    pod_paths = "slide_id,path\nS1,/slides/S1.svs\nS17,/slides/S17.svs\n"  # as the pods see them
    for name in ("brca.csv", "cohort.csv"):
        (session.folder("helm") / name).write_text(pod_paths)


# -- run ----------------------------------------------------------------------------------
def run_ok(session: DocsSession, command: str, folder: str) -> str:
    """Runs ``command`` (ports made local) in ``folder``; its stdout, after exit 0."""
    proc = session.shell(session.local(command), session.folder(folder))
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def python_ok(session: DocsSession, code: str) -> str:
    """Runs a Python program (ports made local) in the README's folder; its stdout."""
    proc = session.python(session.local(code), session.folder("readme"))
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def client_example(session: DocsSession, block: str) -> None:
    session.serving()
    out = python_ok(session, f"{block}\nprint(emb.shape, emb.dtype, emb2.shape)")
    assert out.split() == ["(32,", "1536)", "float32", "(1,", "1536)"], out


def triton_example(client_block: str) -> Check:
    """Run after the client example, as the README reads: ``tiles`` is that example's."""

    def check(session: DocsSession, block: str) -> None:
        session.serving()
        out = python_ok(session, f"{client_block}\n{block}\nprint(emb.shape, emb.dtype)")
        assert out.split() == ["(32,", "1536)", "float32"], out

    return check


def json_bodies(session: DocsSession, command: str) -> None:
    run_ok(session, command, "readme")
    folder = session.folder("readme")
    tile = base64.b64encode((folder / "tile.png").read_bytes()).decode()
    assert json.loads((folder / "v2.json").read_text())["inputs"][0]["data"] == [tile]
    assert json.loads((folder / "v1.json").read_text())["instances"][0]["image_data"] == tile


def curl_example(prefix: str, bodies: str) -> Check:
    """The first 300 bytes of the answer (``| head -c 300``) start as a V2 or V1 answer does."""

    def check(session: DocsSession, command: str) -> None:
        session.serving()
        if not (session.folder("readme") / "v2.json").exists():
            json_bodies(session, bodies)
        out = run_ok(session, command, "readme")
        assert len(out) == 300 and out.startswith(prefix), out

    return check


def embed_readme(session: DocsSession, command: str) -> None:
    session.serving()
    run_ok(session, command, "readme")
    features = session.folder("readme") / "features"
    assert {p.name for p in features.glob("*.h5")} == {"A.h5", "B.h5"}


def notebook_embed(session: DocsSession, block: str) -> None:
    """``histoserve.embed`` writes (or finds done) the slide the CLI would, and reads it back."""
    session.serving()
    shown = (
        "[summary.done + summary.skipped, summary.failed, slide.features.shape, slide.coords.shape]"
    )
    out = python_ok(
        session, f"{block}\nimport json; print(json.dumps({shown} + [slide.attrs['model']]))"
    )
    ids, failed, features, coords, model = json.loads(out)
    assert (ids, failed, model) == (["A"], {}, "h0-mini"), out
    assert features[1] == 1536 and features[0] == coords[0] > 0 and coords[1] == 2, out


def cohort_workflow(first: str, copy: str, masked: str) -> Check:
    """``docs/cohorts.md``'s masks, in order: embed, copy the QC masks, embed with them.

    The host ``h0`` of the docs' ``--url http://h0:8080`` is a placeholder for
    the reader's server: here it is ``localhost``.
    """
    before = {copy: first, masked: copy}
    wrote = {first: "features/brca-h0/qc/S1.geojson", copy: "masks/S1.geojson"}

    def check(session: DocsSession, command: str) -> None:
        session.serving()
        folder = session.folder("cohort")
        previous = before.get(command)
        if previous is not None and not (folder / wrote[previous]).exists():
            check(session, previous)
        run_ok(session, command.replace("http://h0:", "http://localhost:"), "cohort")
        if command == copy:
            masks = {p.name for p in (folder / "masks").glob("*.geojson")}
            assert masks >= {"S1.geojson", "S17.geojson"}, masks
        else:
            features = {p.name for p in (folder / "features" / "brca-h0").glob("*.h5")}
            assert features == {"S1.h5", "S17.h5"}, features

    return check


def my_model(session: DocsSession, block: str) -> None:
    out = python_ok(session, f"{block}\nprint(issubclass(MyModel, BaseServerModel))")
    assert out.strip() == "True", out


def exported(package: str) -> Check:
    """The background export's result: exit 0, the package and its ``.sha256`` beside it."""

    def check(session: DocsSession, command: str) -> None:
        code, out = session.finish(command)
        assert code == 0, f"{command!r} exited {code}:\n{out[-3000:]}"
        path = session.folder("readme") / package
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert (path.parent / f"{path.name}.sha256").read_text().split()[0] == digest

    return check


# -- render -------------------------------------------------------------------------------
@functools.cache
def _validators() -> dict:
    return load_crd_validators()


@functools.cache
def helm_objects(folder: Path, command: str) -> Objects:
    """``helm install ARGS`` as ``helm template ARGS`` (no cluster); every object validated."""
    helm = find_helm()
    if helm is None:
        missing("helm not found (.tools/bin/helm or PATH): run `make helm`")
    argv = shlex.split(command)
    assert argv[:2] == ["helm", "install"], argv
    proc = subprocess.run(
        [helm, "template", *argv[2:]], cwd=folder, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    objs = parse_docs(proc.stdout)
    for obj in objs:
        check_object(obj, _validators())
    return tuple(objs)


def rendered(session: DocsSession, command: str) -> Objects:
    return helm_objects(session.folder("helm"), command)


def kind(objs: Objects, name: str) -> dict:
    (obj,) = [o for o in objs if o["kind"] == name]
    return obj


def chart(expect: Callable[[Objects], None]) -> Check:
    def check(session: DocsSession, command: str) -> None:
        expect(rendered(session, command))

    return check


def isvc_named(name: str, namespace: str) -> Callable[[Objects], None]:
    """The InferenceService's name and namespace; it listens on every interface (pod IPs)."""

    def expect(objs: Objects) -> None:
        meta = kind(objs, "InferenceService")["metadata"]
        assert (meta["name"], meta["namespace"]) == (name, namespace), meta
        assert "bind_address" not in args_of(isvc_container(list(objs)))

    return expect


def package_set_source(init: bool, model_dir: str) -> Callable[[Objects], None]:
    """The InferenceService ``h0-histoserve`` serves the set at ``model_dir``, exporting into it when ``init``."""

    def expect(objs: Objects) -> None:
        isvc_named("h0-histoserve", "histo")(objs)
        predictor = kind(objs, "InferenceService")["spec"]["predictor"]
        assert args_of(isvc_container(list(objs)))["model_dir"] == model_dir
        assert "checkpoint" not in args_of(isvc_container(list(objs)))
        inits = [c["name"] for c in predictor.get("initContainers", [])]
        assert inits == (["build-package"] if init else []), inits

    return expect


def job_in(namespace: str) -> Callable[[Objects], None]:
    def expect(objs: Objects) -> None:
        assert kind(objs, "Job")["metadata"].get("namespace", "default") == namespace

    return expect


def job_args(objs: Objects) -> list[str]:
    (container,) = kind(objs, "Job")["spec"]["template"]["spec"]["containers"]
    return [*container["command"], *container["args"]]


def helm_test(install: str) -> Check:
    """``helm test RELEASE -n NS``: the release ``install`` made has a test-hook pod there."""

    def check(session: DocsSession, command: str) -> None:
        _, _, release, _, namespace, _ = command.split()
        assert shlex.split(install)[2] == release
        objs = rendered(session, install)
        hooks = [o for o in objs if o["metadata"].get("annotations", {}).get(HOOK) == "test"]
        pods = [o["metadata"]["namespace"] for o in hooks if o["kind"] == "Pod"]
        assert pods == [namespace], hooks

    return check


def kubectl_apply(session: DocsSession, command: str) -> None:
    """``kubectl apply -f FILE...``: each file exists and every object in it validates."""
    argv = shlex.split(command)
    files = [argv[i + 1] for i, word in enumerate(argv) if word == "-f"]
    assert files
    for name in files:
        for obj in parse_docs((session.folder("helm") / name).read_text()):
            check_object(obj, _validators())


def job_named(install: str) -> Check:
    """``kubectl -n NS get job NAME``: the namespace and name ``install`` gives its Job."""

    def check(session: DocsSession, command: str) -> None:
        _, _, namespace, _, _, name, _ = command.split()
        meta = kind(rendered(session, install), "Job")["metadata"]
        assert (meta["namespace"], meta["name"]) == (namespace, name)

    return check


def cluster_embed(install: str) -> Check:
    """A cluster ``histoserve embed``: its URL is KServe's for ``install``; its flags parse."""

    def check(session: DocsSession, command: str) -> None:
        meta = kind(rendered(session, install), "InferenceService")["metadata"]
        assert f"--url http://{meta['name']}-predictor.{meta['namespace']}.svc." in command
        parses("histoserve.commands.embed", shlex.split(command)[2:])

    return check


def pod_command(install: str) -> Check:
    """A pod's command shown in the docs: what ``install`` renders, word for word."""

    def check(session: DocsSession, command: str) -> None:
        assert " ".join(job_args(rendered(session, install))) == command
        argv = shlex.split(command)[2:]
        parses("histoserve.commands.embed", argv, JOB_COMPLETION_INDEX="3")

    return check


# -- static -------------------------------------------------------------------------------
def parses(module: str, argv: list[str], **env: str) -> None:
    """``argv`` parses with ``module``'s ``build_parser()`` (``$VAR``/``$(VAR)`` from ``env``)."""
    pattern = r"\$\{?\(?(\w+)\)?\}?"
    argv = [re.sub(pattern, lambda m: env.get(m.group(1), m.group(0)), a) for a in argv]
    parser = importlib.import_module(module).build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as exc:  # argparse's usage error, printed to stderr
        raise AssertionError(f"{module} refuses {argv}: exit {exc.code}") from exc


def flags_parse(module: str, skip: int, **env: str) -> Check:
    """The command's words after the first ``skip`` parse with ``module``'s parser."""

    def check(session: DocsSession, command: str) -> None:
        parses(module, shlex.split(command)[skip:], **env)

    return check


def dockerfile_arg(session: DocsSession, command: str) -> None:
    (name,) = re.findall(r"--build-arg (\w+)=", command)
    assert re.search(rf"^ARG {name}\b", (REPO / "Dockerfile").read_text(), flags=re.MULTILINE)


def dockerfile_server(session: DocsSession, command: str) -> None:
    """The image's server listens on every interface (the rest: tests/chart/test_dockerfile.py)."""
    assert "--bind_address" not in (REPO / "Dockerfile").read_text()


def dockerfile_target(session: DocsSession, command: str) -> None:
    """The export image's tag is what the chart derives; the Dockerfile has that stage."""
    target = re.search(r"--target (\S+)", command) or re.search(r":0\.1\.0-(\w+)$", command)
    assert target and target.group(1) == "export"
    assert re.search(r"^FROM \S+ AS export$", (REPO / "Dockerfile").read_text(), flags=re.M)
    values = (REPO / "charts/histoserve/templates/_build.tpl").read_text()
    assert '"%s:%s-export"' in values


def ray_api(session: DocsSession, block: str) -> None:
    """The Ray example calls ``histoserve.embed`` and reads ``EmbedSummary`` with names they have."""
    import inspect

    from histoserve.api import embed
    from histoserve.embedding.pipeline import EmbedSummary

    tree = ast.parse(block)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    given = {k.arg for n in calls if getattr(n.func, "attr", "") == "embed" for k in n.keywords}
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    read &= {"done", "skipped", "failed", "tiles", "seconds"}
    assert given and given <= set(inspect.signature(embed).parameters), given
    assert read and read <= {f.name for f in dataclasses.fields(EmbedSummary)}, read
