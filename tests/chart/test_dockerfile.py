"""Dockerfile and .dockerignore, checked statically (no Docker engine here)."""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field

import pytest
import tomllib

from tests.chart.helpers import CHART, REPO, load_yaml

DOCKERFILE = (REPO / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VALUES = load_yaml((CHART / "values.yaml").read_text())


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, continuation lines joined, comments dropped."""
    logical, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        op, _, arg = line.partition(" ")
        op, arg = op.upper(), arg.strip()
        if op == "FROM":
            m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", arg, re.IGNORECASE)
            assert m, f"cannot parse FROM {arg!r}"
            stages.append(Stage(base=m.group(1), name=m.group(2)))
        elif not stages:
            assert op == "ARG", f"{op} before the first FROM"
            k, _, v = arg.partition("=")
            global_args[k] = v
        else:
            stages[-1].instructions.append((op, arg))
    return global_args, stages


GLOBAL_ARGS, STAGES = parse(DOCKERFILE)
FINAL = STAGES[-1]


def expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value).strip('"')


def stage_args(stage: Stage) -> dict[str, str]:
    out = dict(GLOBAL_ARGS)
    for a in stage.all("ARG"):
        k, _, v = a.partition("=")
        out[k] = v
    return out


def test_multi_stage_with_wheel_built_in_builder():
    assert len(STAGES) >= 2
    builder = STAGES[0]
    assert builder.name, "the builder stage needs a name"
    assert any("pip wheel" in r and "--no-deps" in r for r in builder.all("RUN"))
    copies_from_builder = [c for c in FINAL.all("COPY") if c.startswith(f"--from={builder.name}")]
    assert copies_from_builder and all("/wheels" in c for c in copies_from_builder)


BASE_RX = r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda(\d+\.\d+)-cudnn(\d+)-{}(@sha256:[a-f0-9]{{64}})?"
EXPORT = next(stage for stage in STAGES if stage.name == "export")


def test_base_image_is_a_pinned_cuda_pytorch_runtime():
    base = GLOBAL_ARGS["BASE_IMAGE"]
    for stage in STAGES:
        if stage is not EXPORT:
            assert stage.base == "${BASE_IMAGE}", "every serving stage starts from the one base"
    m = re.fullmatch(BASE_RX.format("runtime"), base)
    assert m, f"base {base!r} is not a version-pinned pytorch CUDA *runtime* image"
    assert "latest" not in base


def test_the_export_image_is_the_serving_bases_devel_twin():
    """Same torch, CUDA and cuDNN tag as the serving base, only -devel (compiler, CUDA toolkit)."""
    assert EXPORT.base == "${EXPORT_BASE_IMAGE}"
    serving = re.fullmatch(BASE_RX.format("runtime"), GLOBAL_ARGS["BASE_IMAGE"])
    export = re.fullmatch(BASE_RX.format("devel"), GLOBAL_ARGS["EXPORT_BASE_IMAGE"])
    assert export, f"export base {GLOBAL_ARGS['EXPORT_BASE_IMAGE']!r} is not a pinned -devel image"
    assert export.groups()[:3] == serving.groups()[:3]
    assert STAGES.index(EXPORT) < STAGES.index(FINAL), (
        "`docker build .` must still build the server"
    )


def test_the_export_image_checks_its_build_against_the_serving_base_while_building():
    builder_runs = " ".join(STAGES[0].all("RUN"))
    assert "torch.__version__, torch.version.cuda" in builder_runs
    assert "> /wheels/serving-build.txt" in builder_runs
    runs = " ".join(EXPORT.all("RUN"))
    assert "cmp /wheels/serving-build.txt /tmp/export-build.txt" in runs
    assert "torch.__version__, torch.version.cuda" in runs
    assert "g++ --version" in runs and "nvcc --version" in runs
    installs = re.findall(r"pip install ([^&|;]+)", runs)
    assert len(installs) == 1 and '"${wheel}[server,slides,export]"' in installs[0]
    assert "--constraint /tmp/base-constraints.txt" in installs[0]
    (entrypoint,) = EXPORT.all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["python", "-m", "predictor.export"]


def stage_env(stage: Stage) -> dict[str, str]:
    return dict(kv for e in stage.all("ENV") for kv in re.findall(r"(\w+)=(\S+)", e))


def test_the_export_image_runs_as_the_servers_user_with_its_paths():
    (export_user,), (serving_user,) = EXPORT.all("USER"), FINAL.all("USER")
    assert expand(export_user, stage_args(EXPORT)) == expand(serving_user, stage_args(FINAL))
    for var in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert stage_env(EXPORT)[var] == stage_env(FINAL)[var], var


def test_base_torch_is_the_torch_the_tests_run():
    base_torch = re.search(r":(\d+\.\d+\.\d+)-", GLOBAL_ARGS["BASE_IMAGE"]).group(1)
    makefile = (REPO / "Makefile").read_text()
    m = re.search(r"^TORCH_SPEC \?= torch==(\S+)", makefile, re.MULTILINE)
    assert m, "Makefile TORCH_SPEC not found"
    assert base_torch == m.group(1), f"image torch {base_torch} != tested torch {m.group(1)}"
    server = PYPROJECT["project"]["optional-dependencies"]["server"]
    (torch_req,) = [d for d in server if re.match(r"torch\b", d)]
    low = re.search(r">=\s*([\d.]+)", torch_req).group(1)
    assert tuple(map(int, base_torch.split("."))) >= tuple(map(int, (low + ".0.0").split(".")[:3]))


# The image serves and runs `histoserve embed` (the embed chart's Job uses the same image).
IMAGE_EXTRAS = {"server", "slides"}


def test_runtime_installs_only_the_package_and_the_server_and_slides_extras():
    runs = " ".join(FINAL.all("RUN"))
    installs = re.findall(r"pip install ([^&|;]+)", runs)
    assert installs, "the runtime stage installs nothing"
    for cmd in installs:
        targets = [t for t in cmd.split() if not t.startswith("-") and "constraint" not in t]
        targets = [t for t in targets if not t.startswith("/tmp/base-constraints")]
        assert targets == ['"${wheel}[server,slides]"'], f"runtime pip install of {targets}"
    assert "wheel=$(echo /wheels/histoserve-*.whl)" in runs
    for extra in set(PYPROJECT["project"]["optional-dependencies"]) - IMAGE_EXTRAS:
        assert f"[{extra}]" not in runs, f"the serving image must not install the {extra!r} extra"
    assert "-e " not in runs and "editable" not in runs
    assert not re.search(r"apt-get install[^&]*(gcc|g\+\+|build-essential)", runs)


def test_slides_extra_holds_no_dev_tools():
    """What the image gains for `histoserve embed` must be runtime readers and clients only."""
    slides = {
        re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0].lower()
        for d in PYPROJECT["project"]["optional-dependencies"]["slides"]
    }
    assert {"openslide-python", "openslide-bin", "h5py"} <= slides
    assert not slides & {"pytest", "ruff", "hypothesis", "torchvision", "timm", "wsidicom-data"}


def test_runtime_dependencies_are_runtime_only():
    """The image resolves pyproject's dependencies: they must hold no test/dev/export tools.

    The base dependencies are the client side's; torch and kserve come with the
    `server` extra only, so installing the client pulls neither.
    """
    deps = {
        re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0].lower()
        for d in PYPROJECT["project"]["dependencies"]
    }
    dev = {
        re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0].lower()
        for name, extra in PYPROJECT["project"]["optional-dependencies"].items()
        for d in extra
    }
    assert not deps & dev, f"runtime dependencies shared with extras: {deps & dev}"
    assert not deps & {"pytest", "ruff", "hypothesis", "torchvision", "timm"}
    assert not deps & {"torch", "kserve"}
    server = {
        re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0].lower()
        for d in PYPROJECT["project"]["optional-dependencies"]["server"]
    }
    assert {"torch", "kserve"} <= server
    assert not server & {"pytest", "ruff", "hypothesis", "torchvision", "timm"}


def test_non_root_user_matches_the_chart():
    args = stage_args(FINAL)
    (user,) = FINAL.all("USER")
    uid, _, gid = expand(user, args).partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {user!r} must be a numeric non-root UID"
    assert gid.isdigit() and int(gid) != 0
    pod, ctr = VALUES["podSecurityContext"], VALUES["securityContext"]
    assert int(uid) == pod["runAsUser"] == ctr["runAsUser"]
    assert int(gid) == pod["runAsGroup"] == ctr["runAsGroup"] == pod["fsGroup"]
    runs = " ".join(FINAL.all("RUN"))
    assert "useradd" in runs and "HISTOSERVE_UID" in runs


def test_entrypoint_ports_and_model_dir():
    (entrypoint,) = FINAL.all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["python", "-m", "predictor"]
    (expose,) = FINAL.all("EXPOSE")
    assert set(expose.split()) == {"8080", "8081"}
    assert "/opt/ml/model" in " ".join(FINAL.all("RUN"))
    assert VALUES["storage"]["mountPath"] == "/opt/ml/model"


def test_writable_paths_match_the_chart(render):
    """The image's HOME/TMPDIR/cache env is where the chart mounts its emptyDirs."""
    env = stage_env(FINAL)
    from tests.chart.helpers import isvc_container

    chart_env = {e["name"]: e["value"] for e in isvc_container(render())["env"]}
    for var in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert env[var] == chart_env[var], var


def dockerignore_excludes(path: str) -> bool:
    """Docker's last-match-wins semantics for the patterns this .dockerignore uses."""
    excluded = False
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.rstrip("/")
        candidates = [pattern, pattern.replace("**/", "")]
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, c) for c in candidates for p in [*prefixes, parts[-1]]):
            excluded = not negate
    return excluded


@pytest.mark.parametrize(
    "path",
    [
        "pyproject.toml",
        PYPROJECT["project"].get("readme", "README.md"),
        "predictor/__init__.py",
        "predictor/spec.py",
        "histoserve/__init__.py",
        "histoserve/wire/format.py",
    ],
)
def test_dockerignore_keeps_what_the_build_copies(path):
    assert not dockerignore_excludes(path), f".dockerignore drops {path}"


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        ".tools/bin/helm",
        "model/h0-mini.pt2",
        "charts/histoserve/values.yaml",
        "predictor/__pycache__/spec.cpython-311.pyc",
        "histoserve/__pycache__/api.cpython-311.pyc",
        "bench/run.py",
    ],
)
def test_dockerignore_drops_the_rest(path):
    assert dockerignore_excludes(path), f".dockerignore lets {path} into the build context"


def test_copies_only_what_the_wheel_needs():
    sources = []
    for stage in STAGES:
        for c in stage.all("COPY"):
            if c.startswith("--from="):
                continue
            *srcs, _dest = c.split()
            sources += srcs
    readme = PYPROJECT["project"].get("readme", "README.md")
    packages = {
        p.rstrip("*") + "/" for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert packages == {"histoserve/", "predictor/"}  # the client and the server
    assert set(sources) == {"pyproject.toml", readme, *packages}
    for src in ("pyproject.toml", *packages):
        assert (REPO / src).exists()
