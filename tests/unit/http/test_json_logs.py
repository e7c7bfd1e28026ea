"""``--log_format json``'s pieces: the fields a request gives, and one object a line whatever the record."""

from __future__ import annotations

import asyncio
import json
import logging

from predictor.http import json_logs
from predictor.http.json_logs import JsonFormatter, RequestLogContext, request_fields, trace_id_of

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def _record(
    msg: str, *args: object, name: str = "histoserve", exc: bool = False
) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("line one\nline two")
        except ValueError as error:
            exc_info = (type(error), error, error.__traceback__)
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, exc_info)


def test_trace_id_comes_from_a_valid_traceparent_only() -> None:
    assert trace_id_of(TRACEPARENT) == TRACE
    assert trace_id_of(TRACEPARENT.upper()) == TRACE
    assert trace_id_of(None) is None
    assert trace_id_of(f"00-{'0' * 32}-00f067aa0ba902b7-01") is None  # all zero: invalid
    assert trace_id_of(f"00-{TRACE}z-00f067aa0ba902b7-01") is None
    assert trace_id_of("garbage") is None


def test_request_id_is_the_header_or_made_here() -> None:
    fields = request_fields({"x-request-id": "abc-123"}, "/v2/models/h0-mini/infer")
    assert fields.request_id == "abc-123" and fields.model == "h0-mini" and fields.trace_id is None
    for hostile in ("a b", 'a"b', "x" * 129, ""):
        made = request_fields({"x-request-id": hostile}, "/v1/models/m:predict")
        assert made.request_id != hostile and len(made.request_id) == 32
        assert made.model == "m"
    assert request_fields({}, "/metrics").model is None


def test_one_object_a_line_with_the_request_fields() -> None:
    json_logs.set_served("h0-mini", "ab" * 32)
    formatter = JsonFormatter()
    plain = json.loads(formatter.format(_record("loaded %s", "x")))
    assert plain["message"] == "loaded x" and plain["level"] == "WARNING"
    assert plain["model"] == "h0-mini" and plain["package_sha256"] == "ab" * 32
    assert "request_id" not in plain and "trace_id" not in plain

    seen: list[dict] = []

    async def app(scope: dict, receive: object, send: object) -> None:
        seen.append(json.loads(formatter.format(_record("inside", exc=True))))

    headers = [
        (b"x-request-id", b"r-1"),
        (b"traceparent", TRACEPARENT.encode()),
        (b"authorization", b"Bearer s3cret"),
    ]
    scope = {"type": "http", "path": "/v2/models/other/infer", "headers": headers}
    asyncio.run(RequestLogContext(app)(scope, None, None))
    (line,) = seen
    assert line["request_id"] == "r-1" and line["trace_id"] == TRACE and line["model"] == "other"
    assert "line one\\nline two" in json.dumps(line) and "s3cret" not in json.dumps(line)
    after = json.loads(formatter.format(_record("after")))
    assert "request_id" not in after  # the request's fields end with it


def test_the_access_line_loses_its_query_string() -> None:
    record = _record(
        '%s - "%s %s HTTP/%s" %d',
        "127.0.0.1:5",
        "GET",
        "/v2?token=s3cret",
        "1.1",
        200,
        name="uvicorn.access",
    )
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == '127.0.0.1:5 - "GET /v2 HTTP/1.1" 200'
