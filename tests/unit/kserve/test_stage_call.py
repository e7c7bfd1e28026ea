"""``BaseServerModel.__call__`` runs the stages itself and answers as KServe's ``Model.__call__``.

Each test runs the same request through histoserve's ``__call__`` and through
KServe's stock ``Model.__call__`` on the same real model (the demo package,
the real batcher) and compares what a client and ``/metrics`` would see: the
return value, the three ``request_*_seconds`` histograms and the trace line.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kserve import Model
from kserve.model import InferenceVerb
from prometheus_client import REGISTRY

from harness.packages import package_in
from harness.tiles import encode_png, random_tiles
from predictor.errors import InvalidInput
from predictor.families import server_model
from predictor.kserve.stage_call import StageCall
from predictor.model.base import BaseServerModel, ServingOptions
from predictor.spec import BUILTIN_SPECS

STAGES = ("request_preprocess_seconds", "request_predict_seconds", "request_postprocess_seconds")
TRACE_LINE = re.compile(
    r"^requestId: (?P<id>\S+), preprocess_ms: [0-9.e-]+, explain_ms: 0, "
    r"predict_ms: [0-9.e-]+, postprocess_ms: [0-9.e-]+$"
)


def _stock_call(model: BaseServerModel, body: Any, headers: Any = None, verb: Any = None) -> Any:
    """KServe's own ``Model.__call__`` on our model (what histoserve ran before)."""
    return Model.__call__(model, body, headers, verb or InferenceVerb.PREDICT)


def _counts(name: str) -> tuple[float, ...]:
    return tuple(
        REGISTRY.get_sample_value(f"{stage}_count", {"model_name": name}) or 0.0 for stage in STAGES
    )


def _delta(before: tuple[float, ...], after: tuple[float, ...]) -> list[float]:
    return [b - a for a, b in zip(before, after, strict=True)]


def _body(seed: int) -> dict[str, Any]:
    tile = random_tiles(1, seed=seed)[0]
    return {"instances": [{"image_data": base64.b64encode(encode_png(tile)).decode()}]}


@pytest.fixture(scope="module")
def served(
    embedding_package_dir: Path,
) -> Iterator[tuple[BaseServerModel, asyncio.AbstractEventLoop]]:
    """One loaded model with a running batcher, on a loop the tests drive."""
    spec = BUILTIN_SPECS["h0-mini"]
    path = package_in(embedding_package_dir)
    options = ServingOptions(name="costs-model")
    model = server_model(
        spec, path.name, device="cpu", model_root=embedding_package_dir, options=options
    )
    model.load()
    loop = asyncio.new_event_loop()
    loop.run_until_complete(model.start_batching())
    yield model, loop
    loop.run_until_complete(model.drain(5.0))
    model.stop()
    for task in asyncio.all_tasks(loop):  # the batcher's worker tasks
        task.cancel()
    loop.run_until_complete(asyncio.gather(*asyncio.all_tasks(loop), return_exceptions=True))
    loop.close()


def test_predict_answers_and_observes_as_kserve(served) -> None:
    model, loop = served
    body = _body(1)
    before = _counts(model.name)
    ours, our_headers = loop.run_until_complete(model(body, {"x-request-id": "a"}))
    after_ours = _counts(model.name)
    stock, stock_headers = loop.run_until_complete(_stock_call(model, body, {"x-request-id": "b"}))
    after_stock = _counts(model.name)
    assert our_headers == stock_headers == {}
    got = np.asarray(ours["predictions"][0]["output"])
    want = np.asarray(stock["predictions"][0]["output"])
    assert got.shape == (1536,)
    np.testing.assert_array_equal(got, want)
    assert _delta(before, after_ours) == [1.0, 1.0, 1.0]
    assert _delta(after_ours, after_stock) == [1.0, 1.0, 1.0]


def test_bad_input_observes_only_preprocess_as_kserve(served) -> None:
    model, loop = served
    bad = {"instances": [{"image_data": "not base64 png"}]}
    deltas = []
    for call in (model, lambda b: _stock_call(model, b)):
        before = _counts(model.name)
        with pytest.raises(InvalidInput) as caught:
            loop.run_until_complete(call(bad))
        deltas.append((_delta(before, _counts(model.name)), str(caught.value)))
    assert deltas[0] == deltas[1]
    assert deltas[0][0] == [1.0, 0.0, 0.0]


def test_explain_answers_what_kserve_answers(served) -> None:
    model, loop = served
    answers = []
    for call in (model, lambda b, verb: _stock_call(model, b, None, verb)):
        with pytest.raises(Exception) as caught:
            loop.run_until_complete(call(_body(2), verb=InferenceVerb.EXPLAIN))
        answers.append((type(caught.value), str(caught.value)))
    assert answers[0] == answers[1]
    assert answers[0] == (NotImplementedError, "Could not find explainer_host.")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_trace_line_when_latency_logging_is_on(served) -> None:
    model, loop = served
    trace = logging.getLogger("kserve.trace")
    level = trace.level
    handler = _Lines()
    trace.addHandler(handler)
    trace.setLevel(logging.INFO)
    try:
        model.enable_latency_logging = False
        loop.run_until_complete(model(_body(3), {"x-request-id": "quiet"}))
        model.enable_latency_logging = True
        loop.run_until_complete(model(_body(3), {"x-request-id": "ours"}))
        loop.run_until_complete(_stock_call(model, _body(3), {"x-request-id": "stock"}))
    finally:
        model.enable_latency_logging = False
        trace.removeHandler(handler)
        trace.setLevel(level)
    matches = [TRACE_LINE.match(line) for line in handler.lines]
    assert all(matches), handler.lines
    assert [m["id"] for m in matches] == ["ours", "stock"]


def test_stage_call_needs_a_model_name() -> None:
    with pytest.raises(ValueError, match="StageCall needs a model name, got ''"):
        StageCall("")
