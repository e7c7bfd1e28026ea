"""The device owner's side: front ends' samples into the real batchers, answers back.

The device owner is the process that loaded the packages: it holds every
model's :class:`~predictor.batching.batcher.DynamicBatcher`, their device
workers, the process's device scheduler and the GPU(s). Each front end
connects once over a Unix socket and is told every model with its slab
(:mod:`predictor.multiprocess.shm`; one per front end and model) and how to
read it. For every ``submit`` (naming its model) it views the samples in the
slab (no copy), hands them to that model's batcher with the other front
ends' (so one batch gathers every front end's tiles), and once the
request's tiles are settled writes their outputs into the same slots and
answers with one outcome per tile: the result's descriptors, or the error
(the batch's failure, the queue bound, the drain).

The owner is the one admission authority. Every answer carries its model's
queue depth and liveness, and every :data:`STATE_REFRESH_S` each front end
whose last word on a model is too pessimistic (a higher depth than now) or
names another liveness is told the fresh ``("state", model, depth, live)``: a
front end that refused on a full queue sees the room again within that
time, and a lost device fails liveness on every front end, whichever one the
kubelet's probe reaches.

Every submit is answered exactly once: whatever goes wrong on the answer path
(a sample that cannot be viewed, outputs that cannot be written) becomes that
request's failure, never a missing answer. The slabs are made before the front
ends start (one per index, allocated whole); a front end started again gets
its index's slab once its predecessor's tiles are settled. Nothing here knows
HTTP or gRPC.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from predictor import tracing
from predictor.codecs.samples import ModelRequest, ModelResponse, PreparedSample
from predictor.errors import ForwardError, ModelNotReady
from predictor.model.base import BaseServerModel
from predictor.model.forward import BatchItem
from predictor.multiprocess.messages import FrameWriter, error_outcome, frame, read_frame
from predictor.multiprocess.shm import Slab

logger = logging.getLogger("histoserve")

STATE_REFRESH_S = 0.05
"""Longest a front end's view of the queue depth and liveness lags the owner's."""


class DeviceOwner:
    """Serves the front ends' submits from the models' real batchers.

    Args:
        models: The loaded models by name, whose batchers run in this process's loop.
        slabs: Per front-end index, one slab per model (created, allocated).
        socket_path: Where to listen (a private folder's Unix socket).
        info: What a front end needs to serve the models without loading them
            (see :func:`predictor.multiprocess.supervisor.frontend_info`): a
            description per model under ``models``, in order, and the
            repository's ``index``.
        on_ready: Told the pid of each front end that says it serves (its
            ports bound, its models built).
    """

    def __init__(
        self,
        models: Mapping[str, BaseServerModel],
        slabs: Sequence[Mapping[str, Slab]],
        socket_path: Path,
        info: Mapping[str, Any],
        on_ready: Callable[[int], None] = lambda pid: None,
    ) -> None:
        self._models = dict(models)
        self._on_ready = on_ready
        self._slabs = [dict(s) for s in slabs]
        self._socket_path = socket_path
        self._info = dict(info)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._links: dict[int, _Link] = {}
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listens on the socket (the models' batchers must be started)."""
        self._server = await asyncio.start_unix_server(
            self._accept, path=str(self._socket_path), limit=1 << 20
        )
        self._watcher = asyncio.get_running_loop().create_task(self._refresh_states())

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stops listening, waits up to ``timeout_s`` for every connection's tiles, unlinks the slabs.

        Bounded: a batch still running past the drain deadline (a hung device)
        must not keep the pod from exiting. A view still alive keeps its
        mapping (see :meth:`Slab.close`); the names are unlinked anyway.
        """
        if self._server is not None:
            self._server.close()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._connections:
            _, late = await asyncio.wait(set(self._connections), timeout=timeout_s)
            for task in late:
                task.cancel()
        for slabs in self._slabs:
            for slab in slabs.values():
                slab.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve_frontend(reader, writer)
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve_frontend(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        hello = await read_frame(reader)
        if hello is None or hello[0] != "hello" or not 0 <= hello[1] < len(self._slabs):
            return
        _, index, pid = hello
        previous = self._links.get(index)
        if previous is not None:  # its connection is over and its tiles are settled
            await previous.finished.wait()
        slabs = self._slabs[index]
        link = _Link(self._models, slabs, FrameWriter(writer), self._state, self._tell_liveness)
        self._links[index] = link
        models = [
            {**model, "slab": slabs[model["name"]].name,
             "layout": dataclasses.astuple(slabs[model["name"]].layout)}
            for model in self._info["models"]
        ]  # fmt: skip
        writer.write(frame(("welcome", {**self._info, "models": models})))
        logger.info(
            "front end %d (pid %d) connected; slabs %s",
            index, pid, ", ".join(s.name for s in slabs.values()),
        )  # fmt: skip
        try:
            while (message := await read_frame(reader)) is not None:
                if message[0] == "submit":
                    link.submit(*message[1:])
                elif message[0] == "ready":
                    self._on_ready(pid)
        finally:
            link.closed = True
            await link.idle.wait()
            link.finished.set()
            logger.info("front end %d (pid %d) disconnected", index, pid)

    def _state(self, name: str) -> tuple[int, bool]:
        model = self._models[name]
        batcher = model.batcher
        return (batcher.queue_depth if batcher is not None else 0), model.live

    def _tell_liveness(self, name: str, state: tuple[int, bool]) -> None:
        """Tells every front end a liveness of model ``name`` it has not heard, before any
        answer carries it.

        A client that saw a request fail on a lost device and then probes
        another front end must find liveness already false there.
        """
        for link in list(self._links.values()):
            if not link.closed and link.told[name][1] != state[1]:
                link.send_state(name, state)

    async def _refresh_states(self) -> None:
        """Tells each front end a model's depth and liveness when its last word is too pessimistic.

        Only news that opens room (a lower depth) or changes liveness is sent:
        a front end's view of the depth may then lag high for at most
        :data:`STATE_REFRESH_S`, and lag low for as long as it sends nothing,
        which is safe (the owner's batcher refuses what overflows). Sending
        every rise too told idle front ends of tiles in flight elsewhere and
        had them refuse requests the owner would take.
        """
        while True:
            await asyncio.sleep(STATE_REFRESH_S)
            for name in self._models:
                depth, live = self._state(name)
                for link in list(self._links.values()):
                    told = link.told[name]
                    if not link.closed and (live != told[1] or depth < told[0]):
                        link.send_state(name, (depth, live))


class _Link:
    """One front end's slabs and stream, and its requests the batchers still hold."""

    def __init__(
        self,
        models: Mapping[str, BaseServerModel],
        slabs: Mapping[str, Slab],
        writer: FrameWriter,
        state: Callable[[str], tuple[int, bool]],
        tell_liveness: Callable[[str, tuple[int, bool]], None] = lambda name, state: None,
    ) -> None:
        self._models = models
        self.slabs = slabs
        self._writer = writer
        self._state = state
        self._tell_liveness = tell_liveness
        self._outstanding = 0
        self.told: dict[str, tuple[int, bool]] = {name: (0, True) for name in models}
        """Per model, the depth and liveness this front end last heard (its proxy starts at these)."""
        self.closed = False
        self.idle = asyncio.Event()
        self.idle.set()
        self.finished = asyncio.Event()
        """Set once the front end's connection ended and its tiles were settled."""

    def submit(
        self,
        rid: int,
        model: str,
        mode: str,
        priority: int,
        deadline: float | None,
        items: list[tuple[Any, ...]],
        traceparent: str | None = None,
    ) -> None:
        """Enqueues one request's samples to ``model``'s batcher; answers once all are settled.

        A request refused as a whole (queue full, draining, device lost, a
        model this owner does not serve) or whose samples cannot be read from
        the slab is answered at once. A traced request's ``traceparent`` puts
        its queue wait and batches under the front end's span.
        """
        try:
            futures = self._enqueue(
                model, mode, priority, deadline, items, tracing.remote_request(traceparent)
            )
        except Exception as exc:
            self._reply(rid, model, [error_outcome(exc)] * len(items))
            return
        slots = [slot for slot, _, _ in items]
        left = len(futures)
        self._outstanding += 1
        self.idle.clear()

        def settled(_: asyncio.Future[ModelResponse]) -> None:
            nonlocal left
            left -= 1
            if left == 0:
                self._answer(rid, model, futures, slots)

        for future in futures:
            future.add_done_callback(settled)

    def _enqueue(
        self,
        name: str,
        mode: str,
        priority: int,
        deadline: float | None,
        items: list[tuple[Any, ...]],
        trace: tracing.RequestTrace | None,
    ) -> list[asyncio.Future[Any]]:
        model = self._models.get(name)
        batcher = model.batcher if model is not None else None
        if batcher is None:
            raise ModelNotReady(f"model {name!r} has no running batcher")
        view = self.slabs[name].view
        samples = [
            PreparedSample(view(descs[0]), {d[0]: view(d) for d in descs[1:]})
            for _, _, descs in items
        ]
        requests = [ModelRequest(index=index) for _, index, _ in items]
        if trace is None:
            batch_items = list(map(BatchItem, samples, requests))
        else:  # the batcher starts its queue wait
            batch_items = [BatchItem(s, r, trace) for s, r in zip(samples, requests, strict=True)]
        return batcher.submit(batch_items, key=mode, priority=priority, deadline=deadline)

    def _answer(
        self, rid: int, model: str, futures: list[asyncio.Future[ModelResponse]], slots: list[int]
    ) -> None:
        try:
            slab = self.slabs[model]
            outcomes = [
                self._outcome(slab, slot, f) for slot, f in zip(slots, futures, strict=True)
            ]
        except Exception as exc:  # a bug here must not leave the request unanswered
            logger.exception("answering a front end's request failed")
            outcomes = [error_outcome(ForwardError(f"answer failed: {exc}"))] * len(futures)
        self._reply(rid, model, outcomes)
        self._outstanding -= 1
        if self._outstanding == 0:
            self.idle.set()

    def _outcome(
        self, slab: Slab, slot: int, future: asyncio.Future[ModelResponse]
    ) -> tuple[Any, ...]:
        error = ModelNotReady("cancelled") if future.cancelled() else future.exception()
        if error is not None:
            return error_outcome(error)
        try:
            return ("ok", slab.write_outputs(slot, future.result().outputs))
        except Exception as exc:  # outputs that outgrow or do not fit what the model declared
            return error_outcome(exc if isinstance(exc, ForwardError) else ForwardError(str(exc)))

    def _reply(self, rid: int, model: str, outcomes: list[Any]) -> None:
        if self._writer.closing:
            return
        state = self._state(model) if model in self._models else (0, True)
        if model in self.told and state[1] != self.told[model][1]:
            self._tell_liveness(model, state)
        try:
            self._writer.send(("done", rid, *state, outcomes))
        except Exception as exc:  # an outcome that does not pickle: the request still fails
            logger.exception("sending a front end's answer failed")
            failed = error_outcome(ForwardError(f"answer failed: {exc}"))
            self._writer.send(("done", rid, *state, [failed] * len(outcomes)))
        if model in self.told:
            self.told[model] = state

    def send_state(self, model: str, state: tuple[int, bool]) -> None:
        """Sends a model's queue depth and liveness without an answer."""
        if not self._writer.closing:
            self._writer.send(("state", model, *state))
            self.told[model] = state
