"""One URL's transport: server messages quoted without credentials, hostile answers refused.

Real ``httpx`` responses and real V2 bodies (:mod:`histoserve.wire`), no server:
what a server says is scrubbed of every credential *before* it is cut, and
an answer that does not decode (whatever numpy raises on it) is a retryable
failure naming the URL, never an exception that escapes the dispatcher.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from histoserve.errors import RetryableError
from histoserve.remote.auth import MESSAGE_MAX_CHARS, Credentials
from histoserve.remote.http import Reply
from histoserve.remote.transport import decode_answer

SECRET = "s3cr3t-0123456789abcdef"
URL = "http://127.0.0.1:1"


@pytest.mark.parametrize("kind", ["text", "json"])
def test_a_token_straddling_the_cut_leaves_no_prefix(kind: str) -> None:
    creds = Credentials(token=SECRET)
    said = "." * (MESSAGE_MAX_CHARS - 10) + f"Bearer {SECRET} refused"  # 500: 3 chars into it
    body = said if kind == "text" else json.dumps({"error": said})
    message = _reply(401, body).message(creds)
    assert SECRET[:3] not in message  # scrubbed whole first, then cut
    assert message == "." * (MESSAGE_MAX_CHARS - 10) + "Bearer ***... (8 more characters)"
    short = _reply(401, f"Bearer {SECRET} refused").message(creds)
    assert short == "Bearer *** refused"


def _reply(status: int, text: str) -> Reply:
    return Reply(URL, status, httpx.Headers(), text.encode())


def _body(output: dict) -> bytes:
    return json.dumps({"model_name": "m", "outputs": [output]}).encode()


@pytest.mark.parametrize(
    "output",
    [
        {"name": "embedding", "datatype": "FP32", "shape": [1, 1], "data": [{}]},  # TypeError
        {"name": "mask", "datatype": "UINT8", "shape": [1], "data": [300]},  # OverflowError
        {"name": "e", "datatype": "FP32", "shape": [1], "parameters": [1]},  # AttributeError
        {"name": "e", "datatype": "INT32", "shape": [1], "data": [None]},  # TypeError
        {"name": "e", "datatype": "FP32", "shape": [2], "data": [[1], [2, 3]]},  # ValueError
    ],
)
def test_an_answer_that_does_not_decode_is_a_retryable_failure(output: dict) -> None:
    with pytest.raises(RetryableError) as info:
        decode_answer(URL, _body(output), None, Credentials())
    assert str(info.value).startswith(f"{URL}: malformed answer: ")


def test_an_answer_carries_what_it_says_about_who_answered() -> None:
    body = json.dumps(
        {
            "model_name": "h0-mini",
            "model_version": None,
            "parameters": {"package_sha256": "ab" * 32},
            "outputs": [{"name": "e", "datatype": "FP32", "shape": [1], "data": [1.0]}],
        }
    ).encode()
    answer = decode_answer(URL, body, None, Credentials())
    assert dict(answer) == {"e": np.float32([1.0])}
    assert answer.identity == {
        "model_name": "h0-mini",
        "model_version": None,
        "parameters": {"package_sha256": "ab" * 32},
    }
