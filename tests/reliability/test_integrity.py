"""Checkpoint integrity at start-up: a truncated or tampered ``.pt2`` is refused.

The real ``python -m predictor`` is started on a corrupted copy of the package; it must
exit 2 before serving, with exactly one ``histoserve: cannot start`` line that names the
file and the reason. The cases start in parallel (each is a whole interpreter start).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from harness.server import Server, start_server

pytestmark = pytest.mark.integration
PACKAGE = "h0-mini.pt2"


def truncate(model_dir: Path) -> None:
    path = model_dir / PACKAGE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def tamper(model_dir: Path) -> None:
    path = model_dir / PACKAGE
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01  # one bit, deep inside the archive
    path.write_bytes(bytes(data))


def truncate_without_digest(model_dir: Path) -> None:
    truncate(model_dir)
    (model_dir / f"{PACKAGE}.sha256").unlink()


def bad_digest_file(model_dir: Path) -> None:
    (model_dir / f"{PACKAGE}.sha256").write_text("not-a-digest  h0-mini.pt2\n")


CASES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "truncated": (truncate, (PACKAGE, "tampered or truncated", "sha256")),
    "tampered": (tamper, (PACKAGE, "tampered or truncated", "sha256")),
    "truncated-no-digest": (truncate_without_digest, (PACKAGE, "corrupt or truncated")),
    "malformed-digest-file": (bad_digest_file, (f"{PACKAGE}.sha256", "SHA-256")),
}


def test_corrupt_checkpoints_are_refused_at_startup_with_one_clear_line(
    embedding_package_dir: Path, tmp_path: Path
):
    servers: dict[str, Server] = {}
    for name, (corrupt, _) in CASES.items():
        model_dir = tmp_path / name
        shutil.copytree(embedding_package_dir, model_dir)
        corrupt(model_dir)
        servers[name] = start_server(model_dir, tmp_path, model_name="x", wait=False)
    for name, server in servers.items():
        code = server.proc.wait(240)
        lines = [
            ln for ln in server.log().splitlines() if ln.startswith("histoserve: cannot start")
        ]
        assert code == 2 and len(lines) == 1, f"{name}: exit {code}\n{server.log()[-2000:]}"
        for word in CASES[name][1]:
            assert word in lines[0], f"{name}: {word!r} not in {lines[0]!r}"
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.base}/v2/health/ready", timeout=2)
