"""Package fixtures: real demo ``.pt2`` packages, compiled once and cached on disk.

Compiling a package takes 15-60 s, so packages are cached under
``.cache/test-packages/<key>/`` (or ``$HISTOSERVE_TEST_PACKAGE_CACHE``), keyed
by everything that shapes the package: the spec JSON, the source (demo preset
and options, or a ``--module`` target and its source text), the torch version,
the host's CPU instruction sets (packages are built with ``-march=native``) and
the source text of the exporter modules. A second run, or a second pytest
process, reuses them. Builds take a file lock per key and land by atomic
rename, so concurrent sessions never see a half-written package.

Every ``*_package_dir`` fixture is a per-session copy holding exactly one
``<spec>.pt2`` + its ``.sha256`` (+ gene CSVs for multimodal), so tests may
corrupt their copy without touching the cache.
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

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CACHE_ENV = "HISTOSERVE_TEST_PACKAGE_CACHE"
# Exporter sources whose text changes package content.
_KEY_SOURCES = (
    "predictor/demo_models.py",
    "predictor/export.py",
    "predictor/export_sources.py",
    "predictor/genes.py",
    "predictor/hostfacts.py",
    "predictor/package_meta.py",
)


def cache_root() -> Path:
    """Where compiled test packages are kept across sessions."""
    return Path(os.environ.get(CACHE_ENV, REPO / ".cache" / "test-packages"))


def _cache_key(spec_name: str, source: dict[str, Any]) -> str:
    from predictor.hostfacts import isa_flags, read_cpu_flags
    from predictor.spec import resolve_spec

    parts = {
        "spec": resolve_spec(spec_name).to_json(),
        "source": source,
        "torch": torch.__version__,
        "cpu": sorted(isa_flags(read_cpu_flags())),
        "code": {p: (REPO / p).read_text(encoding="utf-8") for p in _KEY_SOURCES},
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


def _cached(spec_name: str, source: dict[str, Any], build: Callable[[Path], object]) -> Path:
    """The cached package for (spec, source); ``build(output)`` makes it when missing."""
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
        from predictor.export import main as export_main

        full = [*argv, "--output", str(output)]
        if export_main(full) != 0:
            raise RuntimeError(f"histoserve export {' '.join(full)} failed (see stderr)")

    return build


_CLI_OPTS = ("device", "dtype", "min_batch", "max_batch", "cpu_target")


def demo_package(spec_name: str, preset: str = "tiny", **opts: Any) -> Path:
    """A cached demo package (the ``.pt2`` path in the cache; copy before modifying).

    Built through the ``histoserve export --demo`` CLI when every option is a
    CLI flag, else through :func:`predictor.export.export_demo`.

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
        return _cached(
            spec_name, source, _cli("--spec", spec_name, "--demo", "--demo_preset", preset, *flags)
        )

    def build(output: Path) -> Path:
        from predictor.export import export_demo
        from predictor.spec import resolve_spec

        return export_demo(resolve_spec(spec_name), output, preset=preset, **opts)

    return _cached(spec_name, source, build)


def module_package(spec_name: str, target: str, *extra_argv: str) -> Path:
    """A cached package built with ``histoserve export --module target``.

    The key includes the factory's source text, so editing it rebuilds the package.
    """
    module_name, _, attr = target.partition(":")
    factory: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        factory = getattr(factory, part)
    source = {"module": target, "argv": list(extra_argv), "text": inspect.getsource(factory)}
    return _cached(spec_name, source, _cli("--spec", spec_name, "--module", target, *extra_argv))


def copy_package_dir(package: Path, dest: Path) -> Path:
    """Copies a cached package's directory (``.pt2``, ``.sha256``, gene CSVs) to ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in package.parent.iterdir():
        if item.is_file() and not item.name.startswith("."):
            shutil.copy2(item, dest / item.name)
    return dest


def _session_dir(tmp_path_factory: pytest.TempPathFactory, name: str, package: Path) -> Path:
    return copy_package_dir(package, tmp_path_factory.mktemp(name))


@pytest.fixture(scope="session")
def embedding_package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``h0-mini.pt2`` (tiny demo ViT, embedding 1536) + ``.sha256``."""
    return _session_dir(tmp_path_factory, "embedding-package", demo_package("h0-mini"))


@pytest.fixture(scope="session")
def multimodal_package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``m-optimus.pt2`` (G=64 in, K=32 out) + ``.sha256`` + ``genes_in.csv``/``genes_out.csv``."""
    return _session_dir(tmp_path_factory, "multimodal-package", demo_package("m-optimus"))


@pytest.fixture(scope="session")
def segmentation_package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tissue-seg.pt2`` (logits ``[B, 1, 512, 512]``) + ``.sha256``."""
    return _session_dir(tmp_path_factory, "segmentation-package", demo_package("tissue-seg"))


@pytest.fixture(scope="session")
def padded_segmentation_package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tissue-seg.pt2`` whose output batch axis is padded to 8 (batches up to 8)."""
    package = demo_package("tissue-seg", pad_to_batch=8)
    return _session_dir(tmp_path_factory, "padded-segmentation-package", package)


@pytest.fixture(scope="session")
def demo_package_factory() -> Callable[..., Path]:
    """:func:`demo_package` as a fixture, for tests that need other options."""
    return demo_package
