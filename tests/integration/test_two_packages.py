"""Two real servers of two real ``h0-mini`` packages: a slide never holds rows of both.

A rolling update caught half way: the session's embedding server (the demo
package) and a server of another package of the same spec, outputs and shapes
(:func:`harness.factories.blank_overflow_model`: other numbers). ``histoserve
embed`` given one URL of each, over gRPC, over REST, and one of each, must
never write a slide mixing them: the servers' descriptions name their
packages over either protocol (REST ``/config``; gRPC ``ModelConfig``, which
the server answers with the same keys), so the run is a usage error naming
both packages before any slide. Before, two ``grpc://`` URLs were compared by
their shapes only and the run wrote a slide of both packages' rows with exit
0; ``http://`` + ``grpc://`` was told apart only by retrying every answer of
the gRPC one.

Also here: the gRPC describing calls themselves, through tritonclient
(``get_model_config``, ``get_model_repository_index``), as any V2 client reads them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness import slides
from harness.embed import run_embed
from harness.packages import other_h0_mini_dir, package_digest
from harness.server import Server, start_server

pytestmark = pytest.mark.integration
FLAGS = ("--model", "h0-mini", "--target-mpp", "0.5", "--batch-size", "4", "--max-attempts", "2")


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another h0-mini package (same spec, outputs and shapes; other weights), cached."""
    return other_h0_mini_dir(tmp_path_factory.mktemp("second-package"))


@pytest.fixture(scope="module")
def other(other_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real server of that package: with the session's embedding server, the module's pair."""
    server = start_server(other_dir, tmp_path_factory.mktemp("second"), "--max_batch_size", "8")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> slides.GeneratedSlide:
    """Tissue tiles at 0.5 um/px, the model's mpp."""
    return slides.generic_tiff(tmp_path_factory.mktemp("two-packages") / "s.tiff")


_digest = package_digest


def _url(server: Server, scheme: str) -> str:
    return server.base if scheme == "http" else f"grpc://{server.grpc_url}"


@pytest.mark.parametrize("schemes", [("grpc", "grpc"), ("http", "http"), ("http", "grpc")])
def test_two_packages_behind_two_urls_never_share_a_slide(
    embedding_server: Server,
    embedding_package_dir: Path,
    other: Server,
    other_dir: Path,
    slide: slides.GeneratedSlide,
    tmp_path: Path,
    schemes: tuple[str, str],
) -> None:
    """Refused before any slide, naming both URLs and both packages; nothing written."""
    first, second = _url(embedding_server, schemes[0]), _url(other, schemes[1])
    out = tmp_path / "out"
    result = run_embed(slide.path, "--url", first, "--url", second, "--out", out, *FLAGS)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert f"--url {first} and --url {second} serve different models" in result.stderr
    assert f"package {_digest(embedding_package_dir)} vs package {_digest(other_dir)}" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not list(out.rglob("*.h5"))


def test_grpc_model_config_and_repository_index_describe_the_model(
    embedding_server: Server, embedding_package_dir: Path
) -> None:
    """What tritonclient reads over gRPC is REST's ``/config``: spec (mpp, tile size), package."""
    name = embedding_server.model_name
    rest = httpx.get(f"{embedding_server.base}/v2/models/{name}/config", timeout=30).json()
    code = (
        "import json, sys, tritonclient.grpc as g\n"
        "c = g.InferenceServerClient(sys.argv[1])\n"
        "print(json.dumps([c.get_model_config(sys.argv[2], as_json=True),\n"
        "                  c.get_model_repository_index(as_json=True)]))\n"
        "try:\n"
        "    c.get_model_config('no-such-model')\n"
        "except Exception as e:\n"
        "    print(e.status())\n"
    )  # tritonclient in its own interpreter: it never shares one with kserve
    run = subprocess.run(
        [sys.executable, "-c", code, embedding_server.grpc_url, name],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    answer, missing = run.stdout.splitlines()
    config, index = json.loads(answer)
    parameters = config["config"]["parameters"]
    said = {key: json.loads(value["string_value"]) for key, value in parameters.items()}
    assert config["config"]["name"] == name
    assert said["package_sha256"] == _digest(embedding_package_dir) == rest["package_sha256"]
    assert said["spec"] == rest["spec"] and said["spec"]["mpp"] == 0.5
    assert said["spec"]["tile_size"] == 224 and said["outputs"] == rest["outputs"]
    assert [m["name"] for m in index["models"]] == [name]
    assert missing == "StatusCode.NOT_FOUND"
