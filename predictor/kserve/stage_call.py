"""KServe's ``Model.__call__`` for a predict, without its per-request lookups.

KServe's version, on every request, looks up its three labelled stage
histograms (``.labels(...)`` validates and hashes the label values and takes
a lock), checks ``inspect.iscoroutinefunction`` on three bound methods and
takes ``time.time()`` pairs (``docs/performance.md``, "The request path (null model)"). :class:`StageCall`
does the same work with the children bound once per model and the stages
awaited directly (histoserve's stages are always coroutines), with the same
observable effects: each stage's ``request_{preprocess,predict,postprocess}
_seconds{model_name}`` observed whether it returned or raised, the
``(response, headers)`` return shape, and KServe's trace line, in its words,
when ``--enable_latency_logging`` is on.
"""

from __future__ import annotations

import time
from typing import Any

from predictor.kserve.compat import stage_histograms, trace_logger


class StageCall:
    """Runs one model's preprocess, predict and postprocess as KServe does.

    The stages are any object's (histoserve's: the model's pipeline,
    :class:`predictor.model.pipeline.Pipeline`), so a request does not go
    back through the KServe ``Model`` that received it. KServe's ``validate``
    is not called: histoserve's codecs validate, and its model's is the identity.

    Args:
        model_name: The ``model_name`` label of KServe's stage histograms.
    """

    def __init__(self, model_name: str):
        if not model_name:
            raise ValueError(f"StageCall needs a model name, got {model_name!r}")
        self._model_name = model_name
        self._timers: tuple[Any, Any, Any] | None = None

    def _bound_timers(self) -> tuple[Any, Any, Any]:
        # Bound on the first request, as KServe's .labels() would, so /metrics
        # shows the series from the same moment it always did.
        if self._timers is None:
            self._timers = stage_histograms(self._model_name)
        return self._timers

    async def __call__(
        self, stages: Any, body: Any, headers: dict[str, str] | None, latency_logging: bool = False
    ) -> tuple[Any, dict[str, str]]:
        """``stages``' three stages on ``body``; returns ``(response, {})`` like KServe.

        ``latency_logging``: the model's ``enable_latency_logging`` (KServe's trace line).
        """
        pre, pred, post = self._bound_timers()
        started = time.perf_counter()
        try:
            payload = await stages.preprocess(body, headers)
        finally:
            pre_done = time.perf_counter()
            pre.observe(pre_done - started)
        try:
            response = await stages.predict(payload, headers)
        finally:
            pred_done = time.perf_counter()
            pred.observe(pred_done - pre_done)
        try:
            response = await stages.postprocess(response, headers)
        finally:
            post_done = time.perf_counter()
            post.observe(post_done - pred_done)
        if latency_logging is True:
            log_latency(headers, pre_done - started, pred_done - pre_done, post_done - pred_done)
        return response, {}


def log_latency(
    headers: dict[str, str] | None, pre_s: float, predict_s: float, post_s: float
) -> None:
    """KServe's per-request latency line, in its words, on its ``kserve.trace`` logger."""
    request_id = headers.get("x-request-id", "N.A.") if headers else "N.A."
    trace_logger.info(
        f"requestId: {request_id}, preprocess_ms: {round(pre_s * 1000, 9)}, "
        f"explain_ms: 0, predict_ms: {round(predict_s * 1000, 9)}, "
        f"postprocess_ms: {round(post_s * 1000, 9)}"
    )
