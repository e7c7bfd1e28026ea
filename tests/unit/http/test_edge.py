"""The server edge: one table maps every error; FastAPI's 422 becomes 400."""

from __future__ import annotations

import grpc
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from predictor.errors import (
    CheckpointError,
    DeviceLost,
    ForwardError,
    HistoserveError,
    InvalidInput,
    ModelNotReady,
    Overloaded,
    PayloadTooLarge,
    SpecMismatch,
    Unavailable,
)
from predictor.http.app import BodyLimitMiddleware
from predictor.http.edge import install_http_handlers, retry_after_header, status_for


@pytest.mark.parametrize(
    ("exc", "http", "code"),
    [
        (InvalidInput("bad", input_name="tiles", tile=2), 400, grpc.StatusCode.INVALID_ARGUMENT),
        (ForwardError("batch failed"), 503, grpc.StatusCode.UNAVAILABLE),
        (DeviceLost("gone"), 503, grpc.StatusCode.UNAVAILABLE),
        (Overloaded("full", retry_after_s=2.5), 503, grpc.StatusCode.UNAVAILABLE),
        (ModelNotReady("draining"), 503, grpc.StatusCode.UNAVAILABLE),
        (CheckpointError("bad"), 503, grpc.StatusCode.UNAVAILABLE),
        (SpecMismatch("bad"), 503, grpc.StatusCode.UNAVAILABLE),
        (PayloadTooLarge("big"), 413, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (HistoserveError("bug"), 500, grpc.StatusCode.INTERNAL),
    ],
)
def test_error_table(exc, http, code):
    status = status_for(exc)
    assert status.http == http and status.grpc == code


def test_foreign_errors_are_not_in_the_table():
    assert status_for(RuntimeError("x")) is None


def test_the_most_specific_class_wins_whatever_the_row_order(monkeypatch):
    from predictor.http import edge

    # The table reversed: the root's row first. Matching by MRO still picks
    # PayloadTooLarge's own row over InvalidInput's and the root's.
    monkeypatch.setattr(edge, "ERROR_TABLE", dict(reversed(list(edge.ERROR_TABLE.items()))))
    assert status_for(PayloadTooLarge("big")).http == 413
    assert status_for(InvalidInput("bad")).http == 400

    class Subclassed(Unavailable):
        pass

    assert status_for(Subclassed("later")).http == 503


def test_retry_after_is_whole_seconds_at_least_one():
    assert retry_after_header(Overloaded("x", retry_after_s=2.5)) == {"Retry-After": "3"}
    assert retry_after_header(Overloaded("x", retry_after_s=0.1)) == {"Retry-After": "1"}
    assert retry_after_header(ForwardError("x")) == {}


class Body(BaseModel):
    inputs: list[int]


def _client(max_body_bytes: int = 1 << 20) -> TestClient:
    app = FastAPI()
    install_http_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body_bytes)

    @app.post("/echo")
    async def echo(body: Body) -> dict:
        if body.inputs == [0]:
            raise InvalidInput("zero is not allowed", input_name="inputs", tile=0)
        if body.inputs == [1]:
            raise Overloaded("queue full", retry_after_s=2)
        return {"n": len(body.inputs)}

    return TestClient(app)


def test_http_mapping_and_422_override():
    client = _client()
    assert client.post("/echo", json={"inputs": [5, 6]}).json() == {"n": 2}
    bad = client.post("/echo", json={"inputs": [0]})
    assert bad.status_code == 400 and bad.json() == {
        "error": "input 'inputs' tile 0: zero is not allowed"
    }
    full = client.post("/echo", json={"inputs": [1]})
    assert full.status_code == 503 and full.headers["retry-after"] == "2"
    malformed = client.post(
        "/echo", content=b'{"inputs": [', headers={"content-type": "application/json"}
    )
    assert malformed.status_code == 400 and "malformed request body" in malformed.json()["error"]
    missing = client.post("/echo", json={"outputs": []})
    assert missing.status_code == 400 and "inputs" in missing.json()["error"]


def test_body_limit():
    client = _client(max_body_bytes=64)
    response = client.post("/echo", json={"inputs": list(range(100))})
    assert response.status_code == 413 and "exceeds" in response.json()["error"]
    assert response.json() == {
        "error": f"request body of {len(response.request.content)} bytes exceeds the limit of 64 bytes"
    }
    assert client.post("/echo", json={"inputs": [2]}).status_code == 200


def test_overload_refusals_are_logged_once_per_interval_with_the_count(monkeypatch, caplog):
    """A flood of 503 refusals (a client ignoring Retry-After) is not a log line each (issue 53)."""
    from predictor.http import edge

    now = [100.0]
    monkeypatch.setattr(edge, "_refusals", edge.RefusalLog(interval_s=1.0, clock=lambda: now[0]))
    with caplog.at_level("WARNING", logger="histoserve"):
        for _ in range(50):
            assert edge.error_response(Overloaded("decode budget full")).status_code == 503
        now[0] += 1.0
        edge.error_response(Overloaded("decode budget full"))
        edge.error_response(ForwardError("batch failed"))  # other 5xx: a line each, as before
        edge.error_response(ForwardError("batch failed"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "request refused (503): decode budget full"
    assert (
        lines[1]
        == "request refused (503): decode budget full (49 more refused since the last line)"
    )
    assert lines[2:] == ["request failed (503): batch failed"] * 2
