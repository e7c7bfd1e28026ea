"""HistoserveClient against the real server behind fakes that answer wrong: over REST and gRPC.

The real ``embedding_server`` answers; a FAKE in front of it tampers with its
answers (the real server cannot be made to answer wrong): over REST
:class:`harness.bad_server.BadServer` (its ``upstream``), over gRPC
:class:`harness.bad_grpc.BadGrpcServer` (``tamper``: the answer's tensors
decoded, changed and re-encoded, answered twice, or another package named).
The first answer of each fake is left alone; every later one is refused.
``tritonclient.grpc`` cannot share the test process with kserve, so the gRPC
client runs in its own interpreter (the same ``HistoserveClient``, imported
from the package).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from harness.bad_grpc import BadGrpcServer
from harness.bad_server import OTHER_PACKAGE, BadServer
from harness.server import REPO, Server
from histoserve.errors import InferenceError, RequestFailed
from histoserve.remote.client import HistoserveClient
from histoserve.remote.dispatch import RetryPolicy

pytestmark = pytest.mark.integration
TILES = np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
KINDS = {
    "short": r"answered 1 row for 2 tiles \(output 'embedding'\)",
    "dtype": r"embedding is FP64, expected FP32",
    "shape": r"embedding has shape \[2, 768\], expected \[2, 1536\]",
    "nan": r"embedding has 3 non-finite values \(NaN or infinity\)",
    "package": rf"answered with package {OTHER_PACKAGE[:16]}, not [0-9a-f]{{16}}",
    "twice": r"malformed answer: output 'embedding' is answered twice",
}
JSON_KINDS = {  # REST only: a JSON answer whose FP32 data are no JSON numbers
    "strings": r"malformed answer: output 'embedding': FP32 data holds \"[-0-9.e]+\", not a JSON number",
    "bools": r"malformed answer: output 'embedding': FP32 data holds (true|false), not a JSON number",
}

_GRPC_CLIENT = """
import json, sys
import numpy as np
from histoserve import HistoserveClient, HistoserveError
from histoserve.remote.dispatch import RetryPolicy

tiles = np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
model, urls, results = sys.argv[1], sys.argv[2:], {}
for url in urls:
    got = results[url] = []
    with HistoserveClient(url, model, 60.0, retry=RetryPolicy(max_attempts=1)) as client:
        for _ in range(2):
            try:
                got.append(["ok", client.infer_pixels(tiles)["embedding"].tolist()])
            except HistoserveError as exc:
                got.append([type(exc).__name__, str(exc)])
print(json.dumps(results))
"""


def _grpc_answers(model: str, urls: list[str]) -> dict[str, list[list]]:
    """``HistoserveClient`` over each ``grpc://`` URL, twice, in its own interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", _GRPC_CLIENT, model, *urls],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_wrong_grpc_answer_is_refused_and_a_right_one_returned(
    embedding_server: Server,
) -> None:
    """Rows, dtype, shape, non-finite values, another package: each refused, over gRPC."""
    fakes = {k: BadGrpcServer(embedding_server.grpc_url, tamper=k, after=1) for k in KINDS}
    try:
        direct = f"grpc://{embedding_server.grpc_url}"
        urls = [direct, *(f.url for f in fakes.values())]
        results = _grpc_answers(embedding_server.model_name, urls)
    finally:
        for fake in fakes.values():
            fake.stop()
    with HistoserveClient(embedding_server.base, embedding_server.model_name, 60.0) as rest:
        want = rest.infer_pixels(TILES)["embedding"]
    for status, rows in results[direct]:
        assert status == "ok"
        np.testing.assert_allclose(np.asarray(rows, np.float32), want, rtol=1e-4, atol=1e-5)
    for kind, message in KINDS.items():
        url = fakes[kind].url
        (first, first_rows), (error, text) = results[url]
        assert first == "ok", (kind, first_rows)  # untampered: passed on as it came
        np.testing.assert_allclose(np.asarray(first_rows, np.float32), want, rtol=1e-4, atol=1e-5)
        assert error == "RequestFailed", (kind, error, text)
        assert re.search(rf"last error: {re.escape(url)}: {message}", text), (kind, text)


@pytest.mark.parametrize("kind", sorted({**KINDS, **JSON_KINDS}))
def test_a_wrong_rest_answer_is_refused(embedding_server: Server, kind: str) -> None:
    """The same answers, tampered over REST: the config's package is checked from the start."""
    with (
        BadServer(embedding_server.base, tamper=kind, after=1) as fake,
        HistoserveClient(fake.url, embedding_server.model_name, 60.0, retry=RetryPolicy(1)) as c,
    ):
        first = c.infer_pixels(TILES)["embedding"]
        with pytest.raises(RequestFailed) as error:
            c.infer_pixels(TILES)
    assert first.shape == (2, 1536) and np.isfinite(first).all()
    assert not isinstance(error.value, InferenceError)
    message = {**KINDS, **JSON_KINDS}[kind]
    assert re.search(rf"last error: {re.escape(fake.url)}\S*: {message}", str(error.value))
