"""The dispatcher's rules through its transport interface, in memory (harness.memory_transport)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from harness.memory_transport import MemoryTransport
from histoserve.errors import BadAnswer, RequestFailed, RetryableError, ServerRefused
from histoserve.remote.answers import AnswerCheck, Expected
from histoserve.remote.dispatch import Dispatcher, RetryPolicy

TILES = np.zeros((4, 8, 8, 3), np.uint8)
CHECK = AnswerCheck((Expected.per_row("embedding", "FP32", (-1, 16)),), "mode 'embedding'", "m")


def _rows(value: float) -> Any:
    def answer(model: str, inputs: Mapping[str, np.ndarray], parameters: Any) -> dict:
        return {"embedding": np.full((len(inputs["pixels"]), 16), value, np.float32)}

    return answer


def _failing(error: Exception) -> Any:
    def answer(*_: object) -> dict:
        raise error

    return answer


def _dispatcher(*transports: MemoryTransport, attempts: int = 4) -> Dispatcher:
    retry = RetryPolicy(max_attempts=attempts, backoff_base_s=0, backoff_max_s=0)
    return Dispatcher(list(transports), retry, sleep=lambda s: None)


def test_a_retryable_failure_goes_to_the_other_transport_with_the_checks_bound() -> None:
    down = MemoryTransport("mem://a", _failing(RetryableError("mem://a: HTTP 503: draining")))
    up = MemoryTransport("mem://b", _rows(1.0))
    with _dispatcher(down, up) as dispatcher:
        got = dispatcher.infer("m", {"pixels": TILES}, {"mode": "embedding"}, check=CHECK)
    assert got["embedding"].shape == (4, 16)
    assert len(down.calls) + len(up.calls) >= 2 and len(up.calls) == 1
    assert up.calls[0][3] == CHECK.max_answer_bytes(4)  # the bound the check sized
    assert down.closed and up.closed


def test_a_wrong_answer_is_a_failed_attempt_and_never_returned() -> None:
    short = MemoryTransport("mem://a", lambda m, i, p: {"embedding": np.zeros((1, 16), np.float32)})
    good = MemoryTransport("mem://b", _rows(2.0))
    with _dispatcher(short, good) as dispatcher:
        got = dispatcher.infer("m", {"pixels": TILES}, {}, check=CHECK)
    assert np.all(got["embedding"] == 2.0)


def test_a_refusal_is_not_retried_and_every_attempt_failing_names_the_last_error() -> None:
    refused = MemoryTransport("mem://a", _failing(ServerRefused("HTTP 400", "bad tile 3")))
    with _dispatcher(refused) as dispatcher, pytest.raises(RequestFailed, match="bad tile 3"):
        dispatcher.infer("m", {"pixels": TILES}, {}, check=CHECK)
    assert len(refused.calls) == 1
    broken = MemoryTransport("mem://a", _failing(BadAnswer("mem://a: malformed answer")))
    last = "failed 3 times; last error: mem://a: malformed"
    with _dispatcher(broken, attempts=3) as dispatcher, pytest.raises(RequestFailed, match=last):
        dispatcher.infer("m", {"pixels": TILES}, {}, check=CHECK)
    assert len(broken.calls) == 3


def test_a_fake_transport_sees_every_request_and_a_callers_check_keeps_the_pin() -> None:
    """The client core's one ``send``: describe, model list and inference all reach the
    transports given; a caller's check (as ``embed`` passes one) adds to the client's,
    so replicas of two packages (a config that reports no digest) never mix in the
    answers: the first answer's package is pinned, the other's answers are retried."""
    from histoserve.remote.client import HistoserveClient
    from predictor.spec import resolve_spec

    outputs = [{"name": "embedding", "datatype": "FP32", "shape": [-1, 16]}]
    config = {"spec": resolve_spec("h0-mini").to_dict(), "outputs": outputs}  # no digest

    def describe(request: Any) -> Any:
        return ["h0-mini"] if request.kind == "models" else config

    def served(url: str, value: float, package: str) -> MemoryTransport:
        identity = {"model_name": "h0-mini", "parameters": {"package_sha256": package * 64}}
        return MemoryTransport(url, _rows(value), identity, describe)

    a, b = served("mem://a", 1.0, "a"), served("mem://b", 2.0, "b")
    retry = RetryPolicy(max_attempts=4, backoff_base_s=0, backoff_max_s=0, cool_down_s=0)
    with HistoserveClient(["http://a", "http://b"], transports=[a, b], retry=retry) as client:
        caller = AnswerCheck.decoded_by("pixels")  # a pixel request: nothing more to hold
        got = [client.infer({"pixels": TILES}, check=caller)["embedding"] for _ in range(6)]
        assert client.model == "h0-mini" and client.package_sha256 == "a" * 64
    assert all((rows == 1.0).all() for rows in got)  # every answer the pinned package's
    assert b.calls  # asked, and its answers refused (retried on a)
    assert [r.kind for r in a.requests[:2]] == ["models", "config"]  # described through it
    assert [r.kind for r in b.requests[:1]] == ["config"]  # every URL is described
    assert {r.kind for r in a.requests[2:]} == {"infer"}
