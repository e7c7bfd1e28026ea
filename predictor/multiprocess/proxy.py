"""A front end's batcher: the real batcher's ``submit`` contract, served by the device owner.

:class:`BatcherProxy` stands where :class:`~predictor.batching.batcher.DynamicBatcher`
stands in one process: ``submit(items, key)`` takes a request's
:class:`~predictor.model.forward.BatchItem` s (all or none) and returns
one future per item, in order. It copies each prepared sample's tile and
extra tensors into a free slot of this front end's slab (the one copy),
sends a small descriptor to the device owner and settles every future
exactly once from the owner's answer: the outputs (copied out of the slot,
which is then free again), the error of the tile's batch, the queue bound's
``Overloaded``, or ``ModelNotReady`` once the owner is gone (liveness then
fails through :attr:`healthy`, and the pod restarts whole).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from predictor import tracing
from predictor.codecs.samples import ModelResponse
from predictor.errors import ForwardError, ModelNotReady, Overloaded
from predictor.multiprocess.messages import FrameWriter, read_frame, rebuild_error
from predictor.multiprocess.shm import ArrayDesc, Slab

logger = logging.getLogger("histoserve")


class BatcherProxy:
    """The device owner's batcher as seen from one front end (a :class:`~predictor.batching.batcher.Batcher`).

    Args:
        sock: The connected Unix socket (handshake done).
        slab: This front end's slab, attached.
        name: The model's name, for messages.
        retry_after_s: ``Retry-After`` of a refusal for want of a free slot.
        on_owner_gone: Called once if the owner goes away while serving.
        on_reject: Told the tiles of a refusal for want of a free slot (the
            metrics' ``rejected``, as the real batcher's observer is told).
    """

    def __init__(
        self,
        sock: socket.socket,
        slab: Slab,
        name: str,
        retry_after_s: float,
        on_owner_gone: Callable[[], None] = lambda: None,
        on_reject: Callable[[int], None] = lambda n: None,
    ) -> None:
        self._sock = sock
        self._on_reject = on_reject
        self._on_owner_gone = on_owner_gone
        self._slab = slab
        self._name = name
        self._retry_after_s = retry_after_s
        self._writer: FrameWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int, tuple[list[asyncio.Future[Any]], list[int]]] = {}
        self._next_id = 0
        self._owner_depth = 0
        self._owner_live = True
        self._connected = False
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def queue_depth(self) -> int:
        """The owner's queue depth at its last answer (its batcher enforces the real bound)."""
        return self._owner_depth

    @property
    def healthy(self) -> bool:
        """False once the device owner is gone or says its device is unusable."""
        return self._connected and self._owner_live

    @property
    def workers(self) -> tuple[Any, ...]:
        """None here: the device workers live in the device owner."""
        return ()

    async def start(self) -> None:
        """Wraps the socket in the running loop and starts reading answers."""
        reader, writer = await asyncio.open_unix_connection(sock=self._sock, limit=1 << 20)
        self._writer = FrameWriter(writer)
        self._connected = True
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    def tell_serving(self) -> None:
        """Tells the device owner this front end serves (its ports listen, its model is built)."""
        if self._writer is not None:
            self._writer.send(("ready",))

    def depth_of(self, priority: int) -> int:
        """The owner's whole queue depth at its last answer (not told per class)."""
        return self._owner_depth

    def submit(
        self,
        items: Sequence[Any],
        key: Hashable = None,
        priority: int = 1,
        deadline: float | None = None,
    ) -> list[asyncio.Future[Any]]:
        """Sends ``items`` (all or none) to the device owner; one future per item, in order.

        ``priority`` and ``deadline`` go with them: the owner's batcher honours them.

        Raises:
            ModelNotReady: The owner is gone, or this front end is draining.
            Overloaded: Not enough free slots in this front end's slab.
        """
        if not self.healthy or self._draining or self._writer is None:
            raise ModelNotReady(f"{self._name}: the device owner is not serving")
        if not items:
            return []
        slots = self._slab.take(len(items))
        if slots is None:
            self._on_reject(len(items))
            raise Overloaded(
                f"{self._name}: queue full ({len(items)} tiles do not fit this front end's "
                f"shared memory, {self._slab.free_slots} slots free)",
                retry_after_s=self._retry_after_s,
            )
        try:
            descs = [
                (slot, item.request.index, self._slab.write_inputs(slot, *_arrays(item)))
                for slot, item in zip(slots, items, strict=True)
            ]
        except Exception:
            self._slab.give_back(slots)
            raise
        rid = self._next_id
        self._next_id += 1
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        self._pending[rid] = (futures, slots)
        self._idle.clear()
        traceparent = tracing.traceparent_of(items[0].trace) if tracing.enabled() else None
        self._writer.send(("submit", rid, key, priority, deadline, descs, traceparent))
        return futures

    async def drain(self, timeout_s: float) -> bool:
        """Refuses new items and waits until every sent one is answered.

        At the deadline, what is still unanswered fails with ``ModelNotReady``
        (as the batcher's own drain fails its backlog) and False is returned;
        those slots stay taken, as the owner may still write into them.
        """
        self._draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            late = ModelNotReady(f"{self._name}: draining deadline passed")
            for futures, _ in self._pending.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(late)
            return False
        return True

    async def close(self) -> None:
        """Closes the connection; unanswered items fail with ``ModelNotReady``."""
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            await self._reader_task

    def close_nowait(self) -> list[asyncio.Task[None]]:
        """:meth:`close` for a model's synchronous ``stop`` (the batcher's contract).

        Returns:
            The reader task, which fails what is unanswered with
            ``ModelNotReady`` as it ends (at the loop's next turns). After the
            loop has closed, only the socket is closed.
        """
        self._draining = True  # a stop, not the owner going away: no liveness alarm
        task = self._reader_task
        if task is None or task.get_loop().is_closed():
            self._sock.close()
            return []
        if self._writer is not None:
            self._writer.close()
        return [] if task.done() else [task]

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while (message := await read_frame(reader)) is not None:
            if message[0] == "done" and len(message) == 5:
                self._settle_safely(*message[1:])
            elif message[0] == "state" and len(message) == 3:
                self._owner_depth, self._owner_live = int(message[1]), bool(message[2])
        self._connected = False
        if not self._draining:
            logger.error("%s: the device owner is gone; liveness fails", self._name)
            self._on_owner_gone()
        gone = ModelNotReady(f"{self._name}: the device owner is gone")
        for futures, _ in self._pending.values():
            for future in futures:
                if not future.done():
                    future.set_exception(gone)
        self._pending.clear()
        self._idle.set()

    def _settle_safely(self, rid: int, *answer: Any) -> None:
        """:meth:`_settle`, and if reading the answer fails, that request fails (a 503)."""
        try:
            self._settle(rid, *answer)
        except Exception as exc:
            logger.exception("%s: reading the device owner's answer failed", self._name)
            futures, slots = self._pending.pop(rid, ([], []))
            failed = ForwardError(f"{self._name}: the answer could not be read: {exc}")
            for future in futures:
                if not future.done():
                    future.set_exception(failed)
            self._slab.give_back(slots)
            if not self._pending:
                self._idle.set()

    def _settle(self, rid: int, depth: int, live: bool, outcomes: list[tuple[Any, ...]]) -> None:
        self._owner_depth = depth
        self._owner_live = live
        futures, slots = self._pending[rid]
        results = [self._result(outcome) for outcome in outcomes]
        if len(results) != len(futures):
            raise ValueError(f"{len(results)} outcomes for {len(futures)} tiles")
        del self._pending[rid]
        for future, result in zip(futures, results, strict=True):
            if future.done():  # cancelled by its caller: nothing to settle
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)
        self._slab.give_back(slots)
        if not self._pending:
            self._idle.set()

    def _result(self, outcome: tuple[Any, ...]) -> ModelResponse | Exception:
        if outcome[0] == "ok":
            return ModelResponse({d[0]: self._copy_out(d) for d in outcome[1]})
        return rebuild_error(*outcome[1:])

    def _copy_out(self, desc: ArrayDesc) -> np.ndarray:
        return self._slab.view(desc).copy()


def _arrays(item: Any) -> tuple[Any, dict[str, Any]]:
    """A batch item's tile and extra tensors."""
    return item.sample.tile, item.sample.extra_tensors
