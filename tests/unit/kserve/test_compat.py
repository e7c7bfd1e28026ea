"""KServe behind one module: nothing outside ``predictor/kserve/compat.py`` reaches a private
KServe name, kserve is pinned to the version installed, and what the compat module and the
code that mirrors KServe rely on (signatures, attributes, the REST infer route, the bodies of
the functions ``fast_infer`` and ``stage_call`` mirror) still has the shape it had.

A failure here after a KServe upgrade is the review list: read the named KServe function,
adjust ``predictor/kserve/compat.py`` (or the mirror), then update the pin or the digest.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import inspect
import re
import textwrap
import types
from pathlib import Path

import kserve
import pytest
import tomllib
import uvicorn
from fastapi import FastAPI
from kserve import InferInput, Model, ModelRepository, ModelServer
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.rest.server import RESTServer
from kserve.protocol.rest.v2_endpoints import V2Endpoints, register_v2_endpoints

from predictor.kserve import compat as kserve_compat
from predictor.kserve import fast_infer

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "predictor"
COMPAT = PACKAGE / "kserve" / "compat.py"
KSERVE = Path(kserve.__file__).parent


# -- no private KServe name outside the compat module -----------------------------------------
def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _kserve_private_names() -> set[str]:
    """Every underscore attribute, function and class name in KServe's own source."""
    names: set[str] = set()
    for path in KSERVE.rglob("*.py"):
        if {"models", "api"} & set(path.relative_to(KSERVE).parts[:-1]):
            continue  # generated Kubernetes API clients: not the server
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.update({node.name} if _private(node.name) else set())
    return names


PUBLIC = {
    n for n in dir(kserve) if not n.startswith("_") and not inspect.ismodule(getattr(kserve, n))
}
KSERVE_PRIVATE = _kserve_private_names()


def _private_of_kserve_bases(cls: type) -> set[str]:
    """The underscore names a class's KServe bases define (methods and ``self._x``)."""
    names: set[str] = set()
    for base in cls.__mro__:
        if base.__module__.split(".")[0] != "kserve":
            continue
        names.update(n for n in vars(base) if _private(n))
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(base)))):
            on_self = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            if on_self and node.value.id == "self" and _private(node.attr):  # type: ignore[attr-defined]
                names.add(node.attr)  # type: ignore[attr-defined]
    return names


def private_kserve_uses(source: str, module: types.ModuleType | None = None) -> list[str]:
    """``line: what`` for each private KServe name ``source`` reaches.

    Flags: importing a KServe submodule (``kserve.protocol...``, ``kserve.errors``...),
    importing a name ``kserve`` does not export publicly, ``obj._x`` where ``_x`` is a
    private name of KServe's source, and ``self._x`` inside a subclass of a KServe class
    when one of its KServe bases defines ``_x``. ``self._x`` of our own classes is ours.
    """
    found: list[str] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith("kserve.")
            ]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kserve"):
            if node.module != "kserve":
                found.append(f"{node.lineno}: from {node.module} import ...")
            else:
                found += [
                    f"{node.lineno}: from kserve import {a.name}"
                    for a in node.names
                    if a.name not in PUBLIC
                ]
        elif isinstance(node, ast.ClassDef) and module is not None:
            inherited = _private_of_kserve_bases(getattr(module, node.name, object))
            found += [
                f"{sub.lineno}: self.{sub.attr} (of a KServe base of {node.name})"
                for sub in ast.walk(node)
                if isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "self"
                and sub.attr in inherited
            ]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr not in KSERVE_PRIVATE:
            continue
        if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def test_no_module_outside_the_compat_module_reaches_a_private_kserve_name() -> None:
    found = []
    for name, path in _modules().items():
        if path == COMPAT:
            continue
        source = path.read_text(encoding="utf-8")
        module = importlib.import_module(name) if "kserve" in source else None
        found += [f"{path.relative_to(ROOT)}:{use}" for use in private_kserve_uses(source, module)]
    assert not found, "\n".join(found)


def test_the_scan_finds_each_kind_of_private_use() -> None:
    class Plane(DataPlane):
        pass

    module = types.SimpleNamespace(Plane=Plane)
    source = textwrap.dedent(
        """
        import kserve.errors
        from kserve.protocol.dataplane import DataPlane
        from kserve import Model, model_server
        class Plane(DataPlane):
            def ready(self):
                return self._model_registry, self._mine
        raw = inp._raw_data
        """
    )
    uses = private_kserve_uses(source, module)  # type: ignore[arg-type]
    assert [u.split(": ", 1)[1] for u in uses] == [
        "import kserve.errors",
        "from kserve.protocol.dataplane import ...",
        "from kserve import model_server",
        "self._model_registry (of a KServe base of Plane)",
        "inp._raw_data",
    ]


# -- the pin ---------------------------------------------------------------------------------
def test_kserve_is_pinned_to_the_version_installed() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    server = project["optional-dependencies"]["server"]  # the client installs no kserve
    pins = [d for d in server if re.match(r"kserve\b", d)]
    assert pins == [f"kserve=={importlib.metadata.version('kserve')}"], pins


# -- the shapes the compat module relies on ----------------------------------------------------
def _parameters(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def test_the_data_plane_has_the_shape_fast_infer_and_histodataplane_call() -> None:
    assert _parameters(DataPlane.__init__) == ["self", "model_registry"]
    assert isinstance(DataPlane.model_registry, property)
    assert _parameters(DataPlane.model_ready) == [
        "self",
        "model_name",
        "disable_predictor_health_check",
    ]
    assert _parameters(DataPlane.decode) == [
        "self",
        "body",
        "headers",
        "protocol_version",
        "model_name",
    ]
    assert _parameters(DataPlane.decode_inference_request) == [
        "self",
        "body",
        "headers",
        "model_name",
    ]
    assert _parameters(DataPlane.infer) == ["self", "model_name", "request", "headers"]
    assert _parameters(DataPlane.encode) == [
        "self",
        "model_name",
        "response",
        "headers",
        "req_attributes",
    ]
    assert _parameters(DataPlane.live) == [] and _parameters(DataPlane.ready) == ["self"]
    assert kserve_compat.INFERENCE_CONTENT_LENGTH_HEADER == "inference-header-content-length"
    assert kserve_compat.REST_V2 == "v2"


def test_the_rest_infer_route_is_the_one_fast_infer_answers() -> None:
    app = FastAPI()
    register_v2_endpoints(app, DataPlane(ModelRepository()), None)
    routes = [  # FastAPI keeps an included router's routes on it (``original_router``)
        sub
        for r in app.routes
        for sub in getattr(getattr(r, "original_router", None), "routes", [r])
    ]
    infer = [r for r in routes if getattr(r.endpoint, "__func__", None) is V2Endpoints.infer]
    paths = {r.path: r.methods for r in infer}
    assert paths[kserve_compat.V2_INFER_ROUTE] == {"POST"}, paths
    assert fast_infer.infer_route_model(_scope("/v2/models/m/infer")) == "m"
    expected = [
        "self",
        "raw_request",
        "raw_response",
        "model_name",
        "request_body",
        "model_version",
    ]
    assert _parameters(V2Endpoints.infer) == expected


def _scope(path: str) -> dict:
    return {"type": "http", "method": "POST", "path": path, "root_path": ""}


MIRRORED = {
    # KServe function: (digest of its source, what mirrors it here)
    "kserve.protocol.rest.v2_endpoints:V2Endpoints.infer": (
        "a14e678d1ceafb7e",
        "predictor/kserve/fast_infer.py:FastInferMiddleware._infer",
    ),
    "kserve.model:Model.__call__": (
        "456f4e9130e632d8",
        "predictor/kserve/stage_call.py:StageCall.__call__",
    ),
}


def _digest(target: str) -> str:
    module, _, qualname = target.partition(":")
    obj: object = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    source = textwrap.dedent(inspect.getsource(obj))  # type: ignore[arg-type]
    return hashlib.sha256(source.encode()).hexdigest()[:16]


@pytest.mark.parametrize("target", sorted(MIRRORED))
def test_the_kserve_functions_we_mirror_are_unchanged(target: str) -> None:
    digest, mirror = MIRRORED[target]
    assert _digest(target) == digest, (
        f"KServe's {target} changed: review {mirror} (it does the same steps), "
        f"then set its digest here to {_digest(target)!r}"
    )


def test_the_model_server_has_what_histomodelserver_uses() -> None:
    assert _parameters(ModelServer._register_and_check_atleast_one_model_is_ready) == [
        "self",
        "models",
    ]
    assigned = {
        n.attr
        for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(ModelServer.__init__))))
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }
    used = {"registered_models", "model_repository_extension", "http_port", "grpc_port"}
    used |= {"workers", "enable_grpc", "grace_period", "max_threads", "access_log_format"}
    used |= {"event_loop", "timeout_keep_alive", "ssl_certfile", "ssl_keyfile"}
    used |= {"enable_latency_logging"}
    assert used <= assigned, used - assigned
    assert callable(ModelServer.setup_event_loop)
    parser = kserve_compat.model_server_parser()
    flags = {a.dest for a in parser._actions}
    assert {"grpc_max_send_message_length", "grpc_max_receive_message_length", "workers"} <= flags


def test_the_rest_server_and_its_uvicorn_server_have_what_app_py_uses() -> None:
    expected = {"app", "data_plane", "model_repository_extension", "http_port", "access_log_format"}
    expected |= {"workers", "grace_period", "event_loop", "timeout_keep_alive"}
    expected |= {"ssl_certfile", "ssl_keyfile"}
    assert expected <= set(_parameters(RESTServer.__init__))
    assert callable(RESTServer.create_application) and callable(RESTServer.start)
    assert "sockets" in _parameters(uvicorn.Server.serve)  # serve_on_socket (front ends)
    rest = RESTServer(
        kserve_compat.FASTAPI_APP_IMPORT_STRING, DataPlane(ModelRepository()), None, 0
    )
    assert isinstance(rest._server, uvicorn.Server)
    kserve_compat.serve_without_signal_capture(rest)
    kserve_compat.request_exit(rest)
    assert rest._server.should_exit is True
    with rest._server.capture_signals():
        pass  # a no-op context: uvicorn leaves SIGTERM to us
    module, _, attr = kserve_compat.FASTAPI_APP_IMPORT_STRING.partition(":")
    assert getattr(importlib.import_module(module), attr) is kserve_compat.fastapi_app()


def test_tensors_grpc_and_metrics_have_what_the_compat_module_uses() -> None:
    inp = InferInput("pixels", [1], "UINT8")
    assert kserve_compat.raw_data(inp) is None
    kserve_compat.set_raw_data(inp, b"\x07")
    assert kserve_compat.raw_data(inp) == b"\x07" and inp.as_numpy().tolist() == [7]
    assert _parameters(InferenceServicer.__init__)[:3] == [
        "self",
        "data_plane",
        "model_repository_extension",
    ]
    assert _parameters(ExceptionToStatusInterceptor.handle_exception) == [
        "self",
        "ex",
        "request_or_iterator",
        "context",
        "method_name",
    ]
    histograms = kserve_compat.stage_histograms("compat-test")
    assert len(histograms) == 3 and all(callable(h.observe) for h in histograms)
    assert issubclass(kserve_compat.KServeModelNotReady, Exception)
    assert "PREDICT" in kserve_compat.InferenceVerb.__members__
    assert inspect.iscoroutinefunction(Model.__call__)
