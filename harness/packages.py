"""Real demo ``.pt2`` packages, compiled once and cached on disk.

Compiling a package takes 15-60 s, so packages are cached under
``.cache/test-packages/<key>/`` (or ``$HISTOSERVE_TEST_PACKAGE_CACHE``), keyed
by everything that shapes the package: the spec JSON, the source (demo preset
and options, or a ``--module`` target and its source text), the torch version,
the host's CPU instruction sets (packages are built with ``-march=native``) and
the source text of the exporter's modules. A second run, a second pytest
process, or the benchmark reuses them. Builds take a file lock per key and land
by atomic rename, so concurrent sessions never see a half-written package.

The cached files are shared: copy them (:func:`copy_package_dir`) before
changing anything.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import inspect
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CACHE_ENV = "HISTOSERVE_TEST_PACKAGE_CACHE"
KEY_SOURCES = (
    "predictor/export/*.py",
    "predictor/packages/*.py",
    "predictor/families/**/*.py",
)
"""Globs of the exporter's sources: their text is part of every package's key (the
exporter, what a package file holds, the families with their demo modules)."""
KEY_EXCLUDES = ("predictor/packages/extract.py",)
"""Modules in those folders that never shape a package (a zip member written out for the
runner to load), so editing them rebuilds nothing. ``predictor/runtime/`` runs packages
and is no source of one (the exporter imports only its load probe, to prove what it
wrote)."""

_CLI_OPTS = ("device", "dtype", "min_batch", "max_batch", "cpu_target", "weights_layout")


def cache_root() -> Path:
    """Where compiled packages are kept across sessions."""
    return Path(os.environ.get(CACHE_ENV, REPO / ".cache" / "test-packages"))


def _code_texts() -> dict[str, str]:
    excluded = {REPO / name for name in KEY_EXCLUDES}
    paths = sorted({p for pattern in KEY_SOURCES for p in REPO.glob(pattern)} - excluded)
    return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in paths}


def _cache_key(spec_name: str, source: dict[str, Any]) -> str:
    import torch

    from predictor.packages.host import isa_flags, read_cpu_flags
    from predictor.spec import resolve_spec

    parts = {
        "spec": resolve_spec(spec_name).to_json(),
        "source": source,
        "torch": torch.__version__,
        "cpu": sorted(isa_flags(read_cpu_flags())),
        "code": _code_texts(),
    }
    blob = json.dumps(parts, sort_keys=True, default=repr).encode()
    return f"{spec_name}-{hashlib.sha256(blob).hexdigest()[:16]}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached(spec_name: str, source: dict[str, Any], build: Callable[[Path], object]) -> Path:
    """The cached package for ``(spec, source)``; ``build(output)`` makes it when missing.

    Args:
        spec_name: Built-in spec name (also the package's file name).
        source: What the package is built from (JSON-able); part of the key.
        build: Writes the package to the path it is given.
    """
    key = _cache_key(spec_name, source)
    final = cache_root() / key
    package = final / f"{spec_name}.pt2"
    if package.is_file():
        return package
    with _locked(cache_root() / f"{key}.lock"):
        if package.is_file():  # another process built it while we waited
            return package
        staging = cache_root() / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            build(staging / package.name)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        shutil.rmtree(final, ignore_errors=True)
        os.rename(staging, final)
    return package


def _cli(*argv: str) -> Callable[[Path], object]:
    """A build step running ``histoserve export argv --output OUT`` in-process."""

    def build(output: Path) -> None:
        from predictor.export.build import main as export_main

        full = [*argv, "--output", str(output)]
        if export_main(full) != 0:
            raise RuntimeError(f"histoserve export {' '.join(full)} failed (see stderr)")

    return build


def demo_package(spec_name: str, preset: str = "tiny", **opts: Any) -> Path:
    """A cached demo package (the ``.pt2`` path in the cache; copy before modifying).

    Built through the ``histoserve export --demo`` CLI when every option is a
    CLI flag, else through :func:`predictor.export.build.export_demo`.

    Args:
        spec_name: Built-in spec name.
        preset: Demo preset (``tiny`` compiles fastest).
        **opts: Export options (``min_batch``, ``max_batch``, ``dtype``, ...)
            or demo model options (``embedding_dim``, ``pad_to_batch``,
            ``genes_in``, ...).
    """
    source = {"demo": preset, "opts": opts}
    if all(k in _CLI_OPTS for k in opts):
        flags = [item for k, v in sorted(opts.items()) for item in (f"--{k}", str(v))]
        return cached(
            spec_name, source, _cli("--spec", spec_name, "--demo", "--demo_preset", preset, *flags)
        )

    def build(output: Path) -> Path:
        from predictor.export.build import export_demo
        from predictor.spec import resolve_spec

        return export_demo(resolve_spec(spec_name), output, preset=preset, **opts)

    return cached(spec_name, source, build)


def module_package(spec_name: str, target: str, *extra_argv: str) -> Path:
    """A cached package built with ``histoserve export --module target``.

    The key includes the factory's source text, so editing it rebuilds the package.
    """
    module_name, _, attr = target.partition(":")
    factory: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        factory = getattr(factory, part)
    source = {"module": target, "argv": list(extra_argv), "text": inspect.getsource(factory)}
    return cached(spec_name, source, _cli("--spec", spec_name, "--module", target, *extra_argv))


def copy_package_dir(package: Path, dest: Path) -> Path:
    """Copies a cached package's directory (``.pt2``, ``.sha256``, gene CSVs) to ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in package.parent.iterdir():
        if item.is_file() and not item.name.startswith("."):
            shutil.copy2(item, dest / item.name)
    return dest


def package_in(model_dir: Path) -> Path:
    """The one ``*.pt2`` in ``model_dir``."""
    (path,) = sorted(model_dir.glob("*.pt2"))
    return path


def package_digest(model_dir: Path) -> str:
    """The SHA-256 of the one ``*.pt2`` in ``model_dir`` (what its answers name)."""
    return hashlib.sha256(package_in(model_dir).read_bytes()).hexdigest()


def other_h0_mini_dir(dest: Path) -> Path:
    """Another ``h0-mini`` package in ``dest`` (the spec, outputs and shapes of the
    session's, other weights: ``harness.factories:blank_overflow_model``), cached."""
    return copy_package_dir(
        module_package("h0-mini", "harness.factories:blank_overflow_model"), dest
    )


CUSTOM_OP = "histoserve_test::scale_add"
"""The custom op of :func:`proxy_executor_package` (``x * 2 + 1``, a Python kernel)."""


def register_custom_op() -> None:
    """Registers :data:`CUSTOM_OP` in this process (once): exporting the package and
    running it through torch's loader both need it."""
    import torch

    namespace, name = CUSTOM_OP.split("::")
    if hasattr(getattr(torch.ops, namespace), name):
        return

    # The schema is spelt out: this module's annotations are strings (no torch at its top).
    @torch.library.custom_op(CUSTOM_OP, mutates_args=(), schema="(Tensor x) -> Tensor")
    def scale_add(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    @scale_add.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)


def proxy_executor_package() -> Path:
    """A real package that needs AOTInductor's proxy executor: a linear layer followed
    by :data:`CUSTOM_OP`, which AOTInductor cannot compile, so the library calls back
    into torch for it and the package carries ``<stem>.json`` beside its ``.so``.

    Inputs ``float32 [2, 16]`` (static), output ``[2, 8]``.
    """
    register_custom_op()

    def build(output: Path) -> None:
        import torch

        torch.manual_seed(0)
        linear = torch.nn.Linear(16, 8).eval()
        op = getattr(getattr(torch.ops, CUSTOM_OP.split("::")[0]), CUSTOM_OP.split("::")[1])

        class WithCustomOp(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.linear = linear

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return op(self.linear(x))

        program = torch.export.export(WithCustomOp(), (torch.randn(2, 16),), strict=False)
        torch._inductor.aoti_compile_and_package(program, package_path=str(output))

    # The cache keys by spec name; the source dict tells this package apart.
    return cached("h0-mini", {"module": "linear16x8+" + CUSTOM_OP}, build)
