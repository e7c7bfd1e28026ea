"""One model's request path, stage by stage: :class:`Pipeline`.

A request enters once, through :meth:`Pipeline.__call__` (admission, then
KServe's three stages timed by :class:`~predictor.kserve.stage_call.StageCall`),
and never returns into the model class: every part it meets is the
pipeline's own.

* **preprocess** (stage 1): the codec is picked once, by the payload (V1 for a
  dict body, V2 for an ``InferRequest``), decodes the request into per-tile
  :class:`~predictor.codecs.samples.ModelRequest` items; the class of service,
  the deadline and the mode are resolved, unknown outputs refused; the tiles
  are counted against the queue bound (:class:`~predictor.model.admission.Admission`)
  and prepared in the decode pool (:class:`~predictor.model.stage1.Stage1Pool`)
  by the model's ``prepare_sample`` (a ``ValueError`` is a 400 for this request).
* **predict** (stage 2): the prepared samples, each with its request
  (:class:`~predictor.model.forward.BatchItem`), go to the model's batcher,
  one future per tile.
* **postprocess**: the same codec encodes the responses, with what answers
  say of the served package.

The batcher is the package side's (:mod:`predictor.model.device_side`): the
device workers' :class:`~predictor.batching.batcher.DynamicBatcher` in this
process, or a front end's proxy of the device owner's. The pipeline asks for
it once, when serving starts, and never asks which it got.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from predictor import tracing
from predictor.batching.batcher import Batcher
from predictor.codecs.base import Codec
from predictor.codecs.jpeg_input import decode_pixels
from predictor.codecs.samples import DecodedRequest, ModelRequest, ModelResponse, PreparedSample
from predictor.codecs.v1 import V1Codec
from predictor.errors import InvalidInput, ModelNotReady, Overloaded
from predictor.kserve.compat import InferRequest, InferResponse
from predictor.kserve.stage_call import StageCall
from predictor.model.admission import Admission
from predictor.model.family import Family, request_mode
from predictor.model.forward import BatchItem, request_tiles
from predictor.model.metrics import Metrics
from predictor.model.options import ServingOptions
from predictor.model.served_package import ServedPackage
from predictor.model.stage1 import Stage1Pool
from predictor.spec import ModelSpec

logger = logging.getLogger("histoserve")

PrepareSample = Callable[[ModelRequest], PreparedSample]
"""The model's ``prepare_sample`` (the seed's hook; the family's unless a subclass overrides it)."""


class BatcherSource(Protocol):
    """Where a pipeline's batcher comes from: its model's package side."""

    async def start(self) -> Batcher:
        """The model's batcher, started on the running loop (called once)."""
        ...


@dataclass
class Prepared:
    """One request between the stages: its codec, decoded form, mode, samples and class.

    ``deadline`` (``time.monotonic()``) is its ``timeout`` from its arrival, or None.
    """

    codec: Codec
    decoded: DecodedRequest
    mode: str
    samples: list[PreparedSample]
    priority: int
    deadline: float | None


class Pipeline:
    """A model's stages: admission, codec, the decode pool, its batcher, the answer.

    Args:
        name: The model's name (URLs, messages, the stage histograms' label).
        spec: The model's spec.
        options: The model's serving options (as its family resolved them).
        family: The model's family (modes, outputs, its V2 codec).
        served: What answers say of the served package.
        batchers: The package side, which gives the batcher at :meth:`start`.
        prepare_sample: Stage 1 for one tile (the model's hook).
        metrics: Prometheus collectors; ``None``: none.
    """

    def __init__(
        self,
        name: str,
        spec: ModelSpec,
        options: ServingOptions,
        family: Family,
        served: ServedPackage,
        batchers: BatcherSource,
        prepare_sample: PrepareSample,
        metrics: Metrics | None = None,
    ) -> None:
        self.name = name
        self._spec = spec
        self._options = options
        self._family = family
        self._served = served
        self._batchers = batchers
        self._prepare_sample = prepare_sample
        self._metrics = metrics
        self._v1 = V1Codec(spec, options.limits)
        self._v2 = family.v2_codec(name)
        self._output_names: dict[str, tuple[str, ...]] = {}  # per mode, the names never change
        self._stage_call = StageCall(name)
        self._pool: Stage1Pool | None = None
        self._batcher: Batcher | None = None
        batching = options.batching
        self._admission = Admission(
            name,
            batching.max_queue_size,
            batching.retry_after_s,
            batching.max_decode_pixels,
            on_reject=lambda n: self._count("rejected", n),
        )

    # -- life cycle -----------------------------------------------------------------------
    @property
    def open(self) -> bool:
        """True once :meth:`open_pool` ran (and until :meth:`stop`)."""
        return self._pool is not None

    def open_pool(self) -> None:
        """Starts the decode pool (the model's load, once its package side is loaded)."""
        if self._pool is None:
            self._pool = Stage1Pool(self._options.preprocess_workers, self._spec.tile_size)

    async def start(self) -> Batcher:
        """Takes the package side's batcher, started in the running loop (once)."""
        if self._batcher is None:
            self._batcher = await self._batchers.start()
        return self._batcher

    @property
    def batcher(self) -> Batcher | None:
        """The running batcher (None before :meth:`start`)."""
        return self._batcher

    @property
    def draining(self) -> bool:
        """True once :meth:`drain` began: every new request is refused."""
        return self._admission.draining

    @property
    def live(self) -> bool:
        """False once no device can serve (a sticky device error, the owner gone)."""
        return self._batcher is None or self._batcher.healthy

    async def drain(self, timeout_s: float, why: str = "shutdown") -> bool:
        """Refuses new work and waits for admitted work; True when all of it ended in time.

        Admitted requests still in stage 1 (decoding) have not reached the
        batcher yet, so the batcher keeps accepting their tiles until every
        admitted request has finished or the deadline passes; then the
        batcher drains whatever is left in the time that remains.
        """
        admission = self._admission
        admission.start_draining(why)
        deadline = time.monotonic() + timeout_s
        if not await admission.wait_idle(timeout_s):
            logger.warning(
                "%s: %d admitted requests still running at the drain deadline",
                self.name,
                admission.admitted,
            )
        if self._batcher is None:
            return admission.admitted == 0
        drained = await self._batcher.drain(max(0.0, deadline - time.monotonic()))
        return drained and admission.admitted == 0

    def stop(self) -> None:
        """Closes the batcher (queued work fails ``ModelNotReady``) and the decode pool."""
        if self._batcher is not None:
            self._batcher.close_nowait()
        if self._pool is not None:
            self._pool.shutdown()

    # -- one request ----------------------------------------------------------------------
    async def __call__(
        self, body: Any, headers: dict[str, str] | None, log_latency: bool = False
    ) -> tuple[Any, dict[str, str]]:
        """One predict request, admitted, through the three stages: ``(response, {})``."""
        with self._admission.request():
            if self._metrics is None:
                return await self._stage_call(self, body, headers, log_latency)
            with self._metrics.inflight():
                return await self._stage_call(self, body, headers, log_latency)

    @contextmanager
    def admitted(self) -> Iterator[None]:
        """Holds one request admitted (and in flight) around a call that is not a plain predict."""
        with self._admission.request():
            if self._metrics is None:
                yield
                return
            with self._metrics.inflight():
                yield

    async def preprocess(
        self, payload: dict | InferRequest, headers: dict[str, str] | None = None
    ) -> Prepared:
        """Stage 1: pick the codec, decode, prepare every tile; 400 on any bad input."""
        if self._admission.draining or self._pool is None:
            raise ModelNotReady(
                f"model {self.name!r} is not accepting requests (draining or not loaded)"
            )
        started = time.monotonic()
        with tracing.stage(tracing.current_request(), "decode"):
            codec: Codec = self._v2 if isinstance(payload, InferRequest) else self._v1
            decoded = codec.decode(payload)
            timeout_us = decoded.timeout_us
            deadline = started + timeout_us / 1e6 if timeout_us else None
            try:
                priority = self._options.batching.priority_of(decoded.priority)
                mode = request_mode(self._family, decoded.mode, decoded.requested_outputs)
                codec.check_outputs(decoded, self.output_names(mode))  # before any compute
                samples = await self._prepare_staged(decoded, priority)
            except InvalidInput:
                self._count("invalid", request_tiles(decoded.items))
                raise
        if self._metrics is not None:
            self._metrics.observe_preprocess(time.monotonic() - started)
        return Prepared(codec, decoded, mode, samples, priority, deadline)

    async def predict(
        self, payload: Prepared, headers: dict[str, str] | None = None
    ) -> tuple[Prepared, list[ModelResponse]]:
        """Stage 2: enqueue the samples (with their requests); one response per tile, in order."""
        if self._batcher is None:
            raise ModelNotReady(f"model {self.name!r} has no running batcher")
        trace = tracing.current_request()
        if trace is None:
            items = list(map(BatchItem, payload.samples, payload.decoded.items))
        else:  # the trace rides on each item; the real batcher starts its queue wait
            items = [
                BatchItem(s, r, trace)
                for s, r in zip(payload.samples, payload.decoded.items, strict=True)
            ]
        futures = self._batcher.submit(
            items, key=payload.mode, priority=payload.priority, deadline=payload.deadline
        )
        try:
            results = await asyncio.gather(*futures)
        except Overloaded:  # refused by the device owner's batcher: counted there, once
            raise
        except Exception:
            self._count("failed", request_tiles(payload.decoded.items))
            raise
        self._count("ok", request_tiles(payload.decoded.items))
        return payload, list(results)

    async def postprocess(
        self, result: tuple[Prepared, list[ModelResponse]], headers: dict[str, str] | None = None
    ) -> dict | InferResponse:
        """Encodes the responses with the codec the request was decoded with."""
        prepared, responses = result
        trace = tracing.current_request()
        if trace is not None:
            trace.answer_started()  # ended by the front door once it is sent
        names = self.output_names(prepared.mode)
        parameters = self._served.answer_parameters(prepared.samples)
        return prepared.codec.encode(prepared.decoded, responses, names, parameters)

    async def _prepare_staged(self, decoded: DecodedRequest, priority: int) -> list[PreparedSample]:
        """Stage 1 for every tile, refused up front (fast 503) when its class's queue is full
        or stage 1 holds as many pixels to decode as it may."""
        depth = self._batcher.depth_of(priority) if self._batcher is not None else 0
        cost = decode_pixels(item.jpeg for item in decoded.items)
        assert self._pool is not None
        with self._admission.staged(request_tiles(decoded.items), depth, cost, priority):
            return await self._pool.prepare(
                decoded.items, decoded.tile_input, self._prepare_sample, cost, priority
            )

    # -- description ----------------------------------------------------------------------
    def output_names(self, mode: str) -> tuple[str, ...]:
        """Output tensor names a (resolved) mode returns, primary first."""
        names = self._output_names.get(mode)
        if names is None:
            names = self._output_names[mode] = tuple(o.name for o in self._family.outputs(mode))
        return names

    def _count(self, outcome: str, n: int) -> None:
        if self._metrics is not None:
            self._metrics.count_tiles(outcome, n)
