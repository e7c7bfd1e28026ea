"""How a failed gRPC call joins the client's error tree (the call itself: tests/integration)."""

from __future__ import annotations

import pytest

from histoserve.errors import BadAnswer, RetryableError, ServerRefused
from histoserve.remote.auth import Credentials
from histoserve.remote.grpc_transport import _wrap, receive_bound

URL = "grpc://127.0.0.1:8081"


class CallError(Exception):
    """What ``tritonclient.grpc`` raises: ``status()`` and ``message()``."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self._status, self._message = status, message

    def status(self) -> str:
        return self._status

    def message(self) -> str:
        return self._message


def wrap(status: str, message: str, own: set[int]) -> Exception:
    return _wrap(URL, CallError(status, message), Credentials(), own)


def test_an_answer_over_this_client_s_bound_is_a_wrong_answer_retried() -> None:
    own = {receive_bound(4 << 20), receive_bound(9 << 20)}
    error = wrap(
        "StatusCode.RESOURCE_EXHAUSTED",
        f"Received message larger than max (70000000 vs. {9 << 20})",
        own,
    )
    assert isinstance(error, BadAnswer) and "an answer larger than this request can need" in str(
        error
    )


def test_a_request_over_the_server_s_bound_is_refused_not_retried() -> None:
    error = wrap(
        "StatusCode.RESOURCE_EXHAUSTED",
        "Received message larger than max (1200000 vs. 500000)",
        {4 << 20},
    )
    assert isinstance(error, ServerRefused) and not isinstance(error, RetryableError)
    assert error.status == "gRPC RESOURCE_EXHAUSTED" and error.code == "RESOURCE_EXHAUSTED"
    assert "the request is larger than the server accepts" in str(error) and "500000" in str(error)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ("StatusCode.RESOURCE_EXHAUSTED", "queue full"),  # another server's overload: retried
        ("StatusCode.UNAVAILABLE", "Received message larger than max (2 vs. 1)"),
    ],
)
def test_other_exhaustion_stays_retried(status: str, message: str) -> None:
    assert isinstance(wrap(status, message, {1}), RetryableError)


def test_the_bound_is_grpc_s_int32_at_most() -> None:
    assert receive_bound(2**40) == 2**31 - 1 and receive_bound(1000) == 1000
