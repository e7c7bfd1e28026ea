"""``histoserve embed`` against servers that answer wrong: never a done file from a wrong answer.

The wrong answers come from :class:`harness.bad_server.BadServer`, a fake
(the real server cannot be made to answer wrong) in front of the real
``embedding_server``: its model list and config are the real ones, and so are
the answers it tampers with (one row for four tiles, no outputs, a renamed
output, FP64, half the floats, NaNs). Each must fail the slide (exit 1) with a
message naming the fake's URL and what was wrong, and leave no ``.h5``; with
a good URL beside the bad one the run is done and every row is the good
server's answer. The fake's ``pixels`` source answers a function of each
tile's pixels (:func:`harness.bad_server.pixel_answer`), so every row's right
value is computed here from tiles read independently with OpenSlide; the
seeded runs are the property test through the CLI: random batch sizes,
concurrency, URLs, 503s and short answers, every row right. Then answers from
another model package: a second ``--url`` serving one (refused up front), a
replica of one behind the same URL (its answers name it: the slide fails),
and a gRPC answer that does not decode (:class:`harness.bad_grpc.BadGrpcServer`:
retried on the other URL).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from harness import slides
from harness.bad_grpc import BadGrpcServer
from harness.bad_server import OTHER_PACKAGE, BadServer, Faults, pixel_answer
from harness.embed import by_status, independent_tiles, read_output, run_embed, status_rows
from harness.server import Server
from predictor.spec import resolve_spec

pytestmark = pytest.mark.integration
DIM = 1536  # h0-mini's embedding, as its config says


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> slides.GeneratedSlide:
    """10 tiles at 0.5 um/px, the model's mpp: read at level 0, no resize."""
    return slides.generic_tiff(tmp_path_factory.mktemp("answers") / "s.tiff")


@pytest.fixture
def fake(embedding_server: Server) -> Iterator[Callable[..., BadServer]]:
    made: list[BadServer] = []

    def make(**kwargs: object) -> BadServer:
        made.append(BadServer(embedding_server.base, **kwargs))
        return made[-1]

    yield make
    for server in made:
        server.stop()


def _embed(slide: slides.GeneratedSlide, out: Path, *urls: str, extra: tuple = ()) -> object:
    url_flags = [flag for url in urls for flag in ("--url", url)]
    return run_embed(slide.path, *url_flags, "--out", out, *extra)


def _pixel_truth(slide: slides.GeneratedSlide, out: dict) -> np.ndarray:
    """The right row of every written tile: :func:`pixel_answer` of tiles read independently."""
    attrs = out["attrs"]
    tiles = independent_tiles(
        slide.path, out["coords"], attrs["read_level"], attrs["read_size"], attrs["tile_size"]
    )
    return pixel_answer(tiles, DIM)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("short", r"answered 1 row for [24] tiles \(output 'embedding'\)"),
        ("empty", r"no 'embedding' output \(mode 'embedding' asks for it; it answered none\)"),
        ("rename", r"no 'embedding' output \(.*it answered 'embeddings'\)"),
        ("dtype", r"embedding is FP64, expected FP32"),
        ("shape", r"embedding has shape \[[24], 768\], expected \[[24], 1536\]"),
        ("nan", r"embedding has 3 non-finite values"),
        ("model", r"answered as model 'another-model', not 'h0-mini'"),
    ],
)
def test_a_wrong_answer_fails_the_slide_naming_the_server(
    fake: Callable[..., BadServer],
    slide: slides.GeneratedSlide,
    tmp_path: Path,
    kind: str,
    message: str,
) -> None:
    bad = fake(tamper=kind, after=1)  # the first answer is right: later ones must not hide
    out = tmp_path / "out"
    result = _embed(slide, out, bad.url, extra=("--batch-size", "4", "--max-attempts", "2"))
    assert result.returncode == 1, result.stderr
    (row,) = status_rows(out)
    assert row["status"] == "failed"
    assert re.search(re.escape(bad.url) + ": " + message, row["error"]), row["error"]
    assert "request failed 2 times" in row["error"]
    assert not list(out.rglob("*.h5"))  # no done file, not even an incomplete one
    assert bad.tampered >= 2  # both attempts of a batch (others may be in flight)


def test_503s_then_right_answers_are_done_with_the_servers_rows(
    fake: Callable[..., BadServer],
    embedding_server: Server,
    slide: slides.GeneratedSlide,
    tmp_path: Path,
) -> None:
    """A control: answers that are right after retries pass the checks untouched."""
    flaky = fake(tamper="503", times=3)
    result = _embed(slide, tmp_path / "flaky", flaky.url, extra=("--batch-size", "4"))
    assert result.returncode == 0, result.stderr
    direct = _embed(slide, tmp_path / "direct", embedding_server.base, extra=("--batch-size", "4"))
    assert direct.returncode == 0, direct.stderr
    got, want = read_output(tmp_path / "flaky/s.h5"), read_output(tmp_path / "direct/s.h5")
    np.testing.assert_array_equal(got["coords"], want["coords"])
    np.testing.assert_allclose(got["features"], want["features"], rtol=1e-4, atol=1e-5)
    assert flaky.tampered == 3


def test_a_bad_url_beside_a_good_one_every_row_is_the_good_answer(
    fake: Callable[..., BadServer], slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    bad, good = fake(source="pixels", tamper="short"), fake(source="pixels")
    out = tmp_path / "out"
    result = _embed(slide, out, bad.url, good.url, extra=("--batch-size", "2"))
    assert result.returncode == 0, result.stderr
    assert by_status(status_rows(out)) == {"done": ["s"]}
    written = read_output(out / "s.h5")
    assert len(written["coords"]) == 10
    np.testing.assert_array_equal(written["features"], _pixel_truth(slide, written))
    assert bad.tampered >= 1 and good.infer_requests >= 5


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_batches_concurrency_retries_and_faults_every_row_right(
    fake: Callable[..., BadServer], slide: slides.GeneratedSlide, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    servers = []
    for i in range(rng.randint(1, 3)):  # each: 2 short answers for sure, then random faults
        faults = Faults(rng.uniform(0, 0.3), rng.uniform(0, 0.3), seed * 10 + i)
        servers.append(fake(source="pixels", tamper="short", times=2, faults=faults))
    flags = (
        "--batch-size", str(rng.randint(2, 7)), "--concurrency", str(rng.randint(1, 6)),
        "--read-workers", str(rng.randint(1, 3)), "--max-attempts", "40",
    )  # fmt: skip
    out = tmp_path / "out"
    result = _embed(slide, out, *(s.url for s in servers), extra=flags)
    assert result.returncode == 0, (flags, result.stderr)
    written = read_output(out / "s.h5")
    np.testing.assert_array_equal(written["features"], _pixel_truth(slide, written))
    assert sum(s.tampered for s in servers) >= 2  # wrong answers were given, and not used


def _package_config(package: str) -> dict:
    """A config reporting ``package`` as its digest (the fakes below answer with pixels)."""
    embedding = {"name": "embedding", "datatype": "FP32", "shape": [-1, DIM]}
    spec = resolve_spec("h0-mini").to_dict()
    return {"name": "h0-mini", "spec": spec, "package_sha256": package, "outputs": [embedding]}


def test_a_second_url_serving_another_package_is_a_usage_error(
    slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    """Same names and shapes, other weights: its rows would go into the same files."""
    a, b = "a" * 64, "b" * 64
    out = tmp_path / "out"
    with (
        BadServer(source="pixels", config=_package_config(a)) as first,
        BadServer(source="pixels", config=_package_config(b)) as other,
    ):
        result = _embed(slide, out, first.url, other.url)
    assert result.returncode == 2, result.stderr
    assert f"--url {first.url} and --url {other.url} serve different models" in result.stderr
    assert f"package {a} vs package {b}" in result.stderr
    assert "Traceback" not in result.stderr
    assert first.infer_requests == other.infer_requests == 0 and not list(out.rglob("*.h5"))


def test_a_replica_of_another_package_behind_one_url_fails_the_slide(
    slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    """A Service mid-upgrade: answers naming another package than the config are never used."""
    package, out = "a" * 64, tmp_path / "out"
    config, flags = _package_config(package), ("--batch-size", "4", "--max-attempts", "2")
    with BadServer(source="pixels", config=config, tamper="package", after=1) as mixed:
        result = _embed(slide, out, mixed.url, extra=flags)
    assert result.returncode == 1, result.stderr
    (row,) = status_rows(out)
    assert row["status"] == "failed"
    wrong = f"answered with package {OTHER_PACKAGE[:16]}, not {package[:16]}"
    assert f"{mixed.url}: {wrong}" in row["error"], row["error"]
    assert not list(out.rglob("*.h5"))


def test_a_grpc_answer_that_does_not_decode_is_retried_on_another_url(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    """Its raw buffer is shorter than its shape: a failed attempt, like a 503."""
    good = f"grpc://{embedding_server.grpc_url}"
    flags = ("--model", "h0-mini", "--target-mpp", "0.5", "--batch-size", "4")
    with BadGrpcServer(embedding_server.grpc_url) as bad:
        result = _embed(slide, tmp_path / "out", bad.url, good, extra=flags)
        assert bad.tampered >= 1
    assert result.returncode == 0, result.stderr
    assert by_status(status_rows(tmp_path / "out")) == {"done": ["s"]}
    direct = _embed(slide, tmp_path / "direct", good, extra=flags)
    assert direct.returncode == 0, direct.stderr
    got, want = read_output(tmp_path / "out/s.h5"), read_output(tmp_path / "direct/s.h5")
    np.testing.assert_array_equal(got["coords"], want["coords"])
    # Two runs are batched differently by the server (a retry, another client's
    # tiles in the window): rows agree to float rounding, a mixed-up row by far more.
    np.testing.assert_allclose(got["features"], want["features"], rtol=1e-4, atol=1e-5)


def test_one_server_over_http_and_grpc_passes_the_same_model_check(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    """The config's outputs and the gRPC metadata of one real server agree: no false alarm."""
    grpc = f"grpc://{embedding_server.grpc_url}"
    result = _embed(slide, tmp_path / "out", embedding_server.base, grpc)
    assert result.returncode == 0, result.stderr
    assert by_status(status_rows(tmp_path / "out")) == {"done": ["s"]}
