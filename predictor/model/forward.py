"""What the batcher carries per tile (:class:`BatchItem`) and how a worker calls ``forward_batch``.

The seed's ``forward_batch(samples, requests, mode)`` takes each sample's
request beside it, so a tile's request travels with its prepared sample
through the queue; the batcher itself never looks inside (it only batches
opaque items by mode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from predictor import tracing
from predictor.codecs.samples import ModelRequest, ModelResponse, PreparedSample

ForwardBatch = Callable[[list[PreparedSample], list[ModelRequest], str], list[ModelResponse]]
"""The model's ``forward_batch(samples, requests, mode)``."""


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One tile in the queue: its prepared sample, the request it came from, its trace.

    ``trace`` is the request's :class:`~predictor.tracing.RequestTrace` when
    it is traced (else ``None``), opaque to the batcher like the rest.
    """

    sample: PreparedSample
    request: ModelRequest
    trace: Any = None


def batch_forward(
    forward_batch: ForwardBatch,
) -> Callable[[list[BatchItem], str], list[ModelResponse]]:
    """A worker's forward: splits a batch of items into samples and requests for ``forward_batch``.

    Traced, the forward runs inside the batch's span (:func:`predictor.tracing.batch`),
    linked to every traced request among the items.
    """

    def run(items: list[BatchItem], mode: str) -> list[ModelResponse]:
        samples, requests = [i.sample for i in items], [i.request for i in items]
        if not tracing.enabled():
            return forward_batch(samples, requests, mode)
        with tracing.batch([i.trace for i in items], len(items), mode):
            return forward_batch(samples, requests, mode)

    return run


def item_tiles(item: BatchItem) -> int:
    """What one queued item counts against ``max_queue_size``: its tiles (a slide's ``N``)."""
    return item.request.tiles


def request_tiles(items: Sequence[ModelRequest]) -> int:
    """The tiles of a request's items (one each, or a slide's ``N``): admission and metrics."""
    return sum(item.tiles for item in items)


def queue_wait_started(items: Sequence[BatchItem]) -> None:
    """The real batcher admitted a request's items: its trace's ``queue_wait`` starts.

    Called by the device workers' batcher (``on_admit``), in one process and
    in a front ends' device owner alike; a front end's proxy never calls it,
    so a front end times no queue it does not hold.
    """
    trace = items[0].trace if items else None
    if trace is not None:
        trace.queue_wait_started()
