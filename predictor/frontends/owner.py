"""The device owner's side: front ends' samples into the one real batcher, answers back.

The device owner is the process that loaded the package: it holds the
model's :class:`~predictor.batching.batcher.DynamicBatcher`, its device
workers and the GPU(s). Each front end connects once over a Unix socket;
the owner creates that front end's slab (:mod:`predictor.frontends.shm`)
and says how to read it. For every ``submit`` it views the samples in the
slab (no copy), hands them to the model's batcher with the other front
ends' (so one batch gathers every front end's tiles), and once the
request's tiles are settled writes their outputs into the same slots and
answers with one outcome per tile: the result's descriptors, or the error
(the batch's failure, the queue bound, the drain).

When the device becomes unusable (a sticky error took out every worker),
every front end is told at once (``("state", depth, live)``), not only the
one whose request saw the failure: liveness and readiness then fail on
whichever front end the kubelet's probe reaches. A front end that goes away
is forgotten once its tiles still in the batcher are settled; its slab is
unlinked then. Nothing here knows HTTP or gRPC.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from predictor.codecs.samples import ModelRequest, ModelResponse, PreparedSample
from predictor.errors import ForwardError, ModelNotReady
from predictor.frontends.messages import FrameWriter, error_outcome, frame, read_frame
from predictor.frontends.shm import Slab, SlotLayout
from predictor.serving.forward import BatchItem
from predictor.serving.model import BaseServerModel

logger = logging.getLogger("histoserve")

LIVENESS_POLL_S = 0.25


class DeviceOwner:
    """Serves the front ends' submits from the model's real batcher.

    Args:
        model: The loaded model whose batcher runs in this process's loop.
        layout: The slot layout of every front end's slab.
        socket_path: Where to listen (a private folder's Unix socket).
        info: What a front end needs to serve the model without loading it
            (see :func:`predictor.frontends.supervisor.frontend_info`).
    """

    def __init__(
        self,
        model: BaseServerModel,
        layout: SlotLayout,
        socket_path: Path,
        info: Mapping[str, Any],
    ) -> None:
        self._model = model
        self._layout = layout
        self._socket_path = socket_path
        self._info = dict(info)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._links: set[_Link] = set()
        self._live = True
        self._watcher: asyncio.Task[None] | None = None
        self.hellos: asyncio.Queue[int] = asyncio.Queue()
        """The pid of each front end that connected (the supervisor's start-up wait)."""
        self.connected: set[int] = set()
        """Every front end's pid that ever connected."""

    async def start(self) -> None:
        """Listens on the socket (the model's batcher must be started)."""
        self._server = await asyncio.start_unix_server(
            self._accept, path=str(self._socket_path), limit=1 << 20
        )
        self._watcher = asyncio.get_running_loop().create_task(self._watch_liveness())

    async def close(self) -> None:
        """Stops listening and waits for every connection's tiles to be settled."""
        if self._server is not None:
            self._server.close()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._connections:
            await asyncio.wait(set(self._connections))

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
        if hello is None or hello[0] != "hello":
            return
        _, index, pid = hello
        link = _Link(
            self._model, Slab.create(self._layout), FrameWriter(writer), self.tell_liveness
        )
        layout = (self._layout.input_bytes, self._layout.output_bytes, self._layout.slots)
        writer.write(frame(("welcome", {**self._info, "slab": link.slab.name, "layout": layout})))
        logger.info("front end %d (pid %d) connected; slab %s", index, pid, link.slab.name)
        self.connected.add(pid)
        self.hellos.put_nowait(pid)
        self._links.add(link)
        try:
            while (message := await read_frame(reader)) is not None:
                if message[0] == "submit":
                    link.submit(*message[1:])
        finally:
            self._links.discard(link)
            await link.idle.wait()  # its tiles still in the batcher view the slab
            link.slab.close()
            logger.info("front end %d (pid %d) disconnected", index, pid)

    def tell_liveness(self) -> None:
        """Tells every front end the model's liveness if it changed since last told."""
        live = self._model.live
        if live != self._live:
            self._live = live
            for link in self._links:
                link.send_state()

    async def _watch_liveness(self) -> None:
        """Catches a change no answer carried (the batcher failing with nothing queued)."""
        while True:
            await asyncio.sleep(LIVENESS_POLL_S)
            self.tell_liveness()


class _Link:
    """One front end's slab and stream, and its requests the batcher still holds."""

    def __init__(
        self,
        model: BaseServerModel,
        slab: Slab,
        writer: FrameWriter,
        after_reply: Callable[[], None],
    ) -> None:
        self._model = model
        self.slab = slab
        self._writer = writer
        self._after_reply = after_reply
        self._outstanding = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def submit(self, rid: int, mode: str, items: list[tuple[Any, ...]]) -> None:
        """Enqueues one request's samples; answers once all its futures are settled."""
        slab = self.slab
        samples = [
            PreparedSample(slab.view(descs[0]), {d[0]: slab.view(d) for d in descs[1:]})
            for _, _, descs in items
        ]
        requests = [ModelRequest(index=index) for _, index, _ in items]
        batcher = self._model.batcher
        try:
            if batcher is None:
                raise ModelNotReady(f"model {self._model.name!r} has no running batcher")
            futures = batcher.submit(list(map(BatchItem, samples, requests)), key=mode)
        except Exception as exc:  # refused as a whole: queue full, draining, device lost
            self._reply(rid, [error_outcome(exc)] * len(items))
            return
        slots = [slot for slot, _, _ in items]
        left = len(futures)
        self._outstanding += 1
        self.idle.clear()

        def settled(_: asyncio.Future[ModelResponse]) -> None:
            nonlocal left
            left -= 1
            if left == 0:
                self._answer(rid, futures, slots)

        for future in futures:
            future.add_done_callback(settled)

    def _answer(
        self, rid: int, futures: list[asyncio.Future[ModelResponse]], slots: list[int]
    ) -> None:
        outcomes: list[tuple[Any, ...]] = []
        for slot, future in zip(slots, futures, strict=True):
            error = ModelNotReady("cancelled") if future.cancelled() else future.exception()
            if error is None:
                try:
                    outcomes.append(("ok", self.slab.write_outputs(slot, future.result().outputs)))
                    continue
                except ForwardError as exc:  # outputs larger than the model declared
                    error = exc
            outcomes.append(error_outcome(error))
        self._reply(rid, outcomes)
        self._outstanding -= 1
        if self._outstanding == 0:
            self.idle.set()

    def _reply(self, rid: int, outcomes: list[Any]) -> None:
        if not self._writer.closing:
            self._writer.send(("done", rid, *self._state(), outcomes))
        self._after_reply()

    def send_state(self) -> None:
        """Sends the owner's queue depth and liveness without an answer."""
        if not self._writer.closing:
            self._writer.send(("state", *self._state()))

    def _state(self) -> tuple[int, bool]:
        batcher = self._model.batcher
        return (batcher.queue_depth if batcher is not None else 0), self._model.live
