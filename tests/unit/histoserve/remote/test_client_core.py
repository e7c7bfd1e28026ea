"""HistoserveClient is the one core: every answer checked as ``embed`` checks it, retried, typed errors.

The servers answering wrong are :class:`harness.bad_server.BadServer`, a FAKE
(the real server cannot be made to answer wrong) on a real loopback socket,
speaking real V2 binary bodies: its config is an ``h0-mini`` config (with a
small embedding) and its answers a function of each tile's pixels
(:func:`harness.bad_server.pixel_answer`), so every right row is computed
here; the tampered ones are what a bug, a proxy or another package behind the
URL would answer. The same over gRPC, with the real server behind a fake:
``tests/integration/test_client_core.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest

from harness.bad_server import OTHER_PACKAGE, BadServer, pixel_answer
from histoserve.errors import InferenceError, RequestFailed, UsageError
from histoserve.remote.answers import AnswerCheck
from histoserve.remote.client import HistoserveClient
from histoserve.remote.dispatch import RetryPolicy
from histoserve.remote.served_model import info_from_config
from predictor.spec import resolve_spec

DIM = 6
PACKAGE = "a" * 64
CONFIG = {
    "name": "h0-mini",
    "spec": resolve_spec("h0-mini").to_dict(),
    "package_sha256": PACKAGE,
    "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, DIM]}],
}
TILES = np.random.default_rng(3).integers(0, 256, (3, 4, 4, 3), dtype=np.uint8)


@pytest.fixture
def fakes() -> Iterator[list[BadServer]]:
    made: list[BadServer] = []
    yield made
    for server in made:
        server.stop()


def _fake(fakes: list[BadServer], **kwargs: object) -> BadServer:
    fakes.append(BadServer(config=CONFIG, source="pixels", dim=DIM, **kwargs))
    return fakes[-1]


def _client(*urls: str, attempts: int = 2, model: str = "h0-mini") -> HistoserveClient:
    return HistoserveClient(list(urls), model, 10.0, retry=RetryPolicy(max_attempts=attempts))


def test_a_right_answer_is_returned_with_who_answered() -> None:
    with BadServer(config=CONFIG, source="pixels", dim=DIM) as fake, _client(fake.url) as client:
        out = client.infer_pixels(TILES)
        assert client.info.package_sha256 == PACKAGE  # described once, from its config
    assert list(out) == ["embedding"]
    np.testing.assert_array_equal(out["embedding"], pixel_answer(TILES, DIM))
    assert out.identity["parameters"]["package_sha256"] == PACKAGE


WRONG = [
    ("short", r"answered 1 row for 3 tiles \(output 'embedding'\)"),
    ("empty", r"no 'embedding' output \(mode 'embedding' asks for it; it answered none\)"),
    ("rename", r"no 'embedding' output \(.*it answered 'embeddings'\)"),
    ("dtype", r"embedding is FP64, expected FP32"),
    ("shape", rf"embedding has shape \[3, {DIM // 2}\], expected \[3, {DIM}\]"),
    ("nan", r"embedding has 3 non-finite values \(NaN or infinity\)"),
    ("model", r"answered as model 'another-model', not 'h0-mini'"),
    ("package", rf"answered with package {OTHER_PACKAGE[:16]}, not {PACKAGE[:16]}"),
    ("huge", r"an answer of 536,870,912 bytes, more than the [\d,]+ this request can need"),
]


@pytest.mark.parametrize(("kind", "message"), WRONG, ids=[k for k, _ in WRONG])
def test_a_wrong_answer_is_refused_as_embed_refuses_it(
    fakes: list[BadServer], kind: str, message: str
) -> None:
    """Rows, outputs, dtype, shape, finite values, model, package, size: never returned."""
    bad = _fake(fakes, tamper=kind)
    with _client(bad.url) as client, pytest.raises(RequestFailed) as error:
        client.infer_pixels(TILES)
    assert not isinstance(error.value, InferenceError)  # the server said 200: no status
    assert re.search(
        rf"failed 2 times; last error: {re.escape(bad.url)}\S*: {message}", str(error.value)
    )
    assert bad.infer_requests == 2  # a failed attempt, retried like a 503
    if kind != "huge":  # embed's own check says the same of the same answer
        assert re.search(message, str(_embed_problem(kind)))


def _embed_problem(kind: str) -> str | None:
    """What ``embed``'s check (:class:`AnswerCheck`, as ``slide_job`` builds it) says of ``kind``."""
    from harness.bad_server import tamper
    from histoserve.remote.transport import Answer

    info = info_from_config("h0-mini", CONFIG)
    outputs = tamper(kind, {"embedding": pixel_answer(TILES, DIM)})
    name = "another-model" if kind == "model" else "h0-mini"
    package = OTHER_PACKAGE if kind == "package" else PACKAGE
    answer = Answer(outputs, {"model_name": name, "parameters": {"package_sha256": package}})
    return AnswerCheck.for_mode(info, "embedding").problem(answer, len(TILES))


def test_a_wrong_answer_is_retried_on_another_url_and_the_right_one_returned(
    fakes: list[BadServer],
) -> None:
    bad, good = _fake(fakes, tamper="short"), _fake(fakes)
    with _client(bad.url, good.url, attempts=3) as client:
        outs = [client.infer_pixels(TILES)["embedding"] for _ in range(4)]
        stats = client.stats()
    for out in outs:
        np.testing.assert_array_equal(out, pixel_answer(TILES, DIM))
    assert bad.infer_requests >= 1 and stats[bad.url]["failed"] == bad.infer_requests


def test_server_refusals_are_inference_errors_with_their_status(fakes: list[BadServer]) -> None:
    """A 503 on every attempt keeps its status and Retry-After; an unknown model is a usage
    error naming it (the describe's 404, the one path for every caller)."""
    busy = _fake(fakes, tamper="503")
    with _client(busy.url) as client, pytest.raises(InferenceError) as error:
        client.infer_pixels(TILES)
    assert error.value.status == 503 and error.value.retry_after_s == 0.0
    assert "busy (on purpose)" in str(error.value) and busy.infer_requests == 2
    with _client(busy.url, model="other") as client, pytest.raises(UsageError) as missing:
        client.infer_pixels(TILES)
    assert "serves no model 'other'" in str(missing.value) and "HTTP 404" in str(missing.value)
    assert busy.infer_requests == 2  # asked nothing


def test_the_client_core_is_what_embed_and_aggregate_send_through() -> None:
    """No second path: neither builds a dispatcher of its own."""
    from pathlib import Path

    import histoserve

    root = Path(histoserve.__file__).parent
    for module in ("embedding/pipeline.py", "embedding/slide_job.py", "heads/aggregate.py"):
        text = (root / module).read_text()
        assert "HistoserveClient" in text and "Dispatcher" not in text, module


def test_what_an_answer_must_be_is_read_off_what_the_config_declares(
    fakes: list[BadServer],
) -> None:
    """A ``mask`` output: a tissue model's masks are checked; a ``features`` input: a slide head."""
    from histoserve.errors import UsageError

    masks = {"name": "mask", "datatype": "UINT8", "shape": [-1, 4, 4]}
    tissue = {**CONFIG, "name": "tissue-seg", "spec": resolve_spec("tissue-seg").to_dict()}
    tissue["outputs"] = [masks]
    fakes.append(BadServer(config=tissue, source="mask"))
    fakes.append(BadServer(config=tissue, source="mask", tamper="short"))
    with _client(fakes[0].url, model="tissue-seg") as client:
        out = client.infer_pixels(TILES)
        assert client.info.answers_masks and not client.info.takes_features
    np.testing.assert_array_equal(out["mask"], (TILES.min(axis=-1) < 220).astype(np.uint8))
    with _client(fakes[1].url, model="tissue-seg") as client, pytest.raises(RequestFailed) as error:
        client.infer_pixels(TILES)
    assert "answered 1 row for 3 tiles (output 'mask')" in str(error.value)
    head = {**CONFIG, "name": "abmil-demo", "spec": resolve_spec("abmil-demo").to_dict()}
    head["inputs"] = [{"name": "features", "datatype": "FP32", "shape": [-1, 1536]}]
    fakes.append(BadServer(config=head, source="pixels", dim=DIM))
    with _client(fakes[2].url, model="abmil-demo") as client, pytest.raises(UsageError) as usage:
        client.infer({"features": np.zeros((3, 1536), np.float32)})
    assert "is a slide head (it takes 'features')" in str(usage.value)
    assert fakes[2].infer_requests == 0
