"""A front end's batchers: the real batcher's ``submit`` contract, served by the device owner.

:class:`BatcherProxy` stands where :class:`~predictor.batching.batcher.DynamicBatcher`
stands in one process, one per model: ``submit(items, key)`` takes a request's
:class:`~predictor.model.forward.BatchItem` s (all or none) and returns
one future per item, in order. It copies each prepared sample's tile and
extra tensors into a free slot of this front end's slab for that model (the
one copy), sends a small descriptor to the device owner and settles every
future exactly once from the owner's answer: the outputs (copied out of the
slot, which is then free again), the error of the tile's batch, the queue
bound's ``Overloaded``, or ``ModelNotReady`` once the owner is gone (liveness
then fails through :attr:`BatcherProxy.healthy`, and the pod restarts whole).

Every model's proxy of a front end shares one :class:`OwnerLink`: the one
connection to the device owner, its reader and the requests in flight.
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


class OwnerLink:
    """One front end's connection to the device owner, shared by every model's proxy.

    Args:
        sock: The connected Unix socket (handshake done).
        on_owner_gone: Called once if the owner goes away while serving.
    """

    def __init__(self, sock: socket.socket, on_owner_gone: Callable[[], None] = lambda: None):
        self._sock = sock
        self._on_owner_gone = on_owner_gone
        self._writer: FrameWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._proxies: dict[str, BatcherProxy] = {}
        self._open: set[str] = set()
        self._owners: dict[int, BatcherProxy] = {}  # request id: the model's proxy
        self._next_id = 0
        self.connected = False
        self.stopping = False

    def proxy(
        self,
        name: str,
        slab: Slab,
        retry_after_s: float,
        on_reject: Callable[[int], None] = lambda n: None,
    ) -> BatcherProxy:
        """Model ``name``'s batcher over this link (its own slab)."""
        proxy = BatcherProxy(self, slab, name, retry_after_s, on_reject)
        self._proxies[name] = proxy
        self._open.add(name)
        return proxy

    async def start(self) -> None:
        """Wraps the socket in the running loop and starts reading answers (once)."""
        if self._reader_task is not None:
            return
        reader, writer = await asyncio.open_unix_connection(sock=self._sock, limit=1 << 20)
        self._writer = FrameWriter(writer)
        self.connected = True
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    def tell_serving(self) -> None:
        """Tells the device owner this front end serves (its ports listen, its models are built)."""
        if self._writer is not None:
            self._writer.send(("ready",))

    def send_submit(self, proxy: BatcherProxy, message: tuple[Any, ...]) -> int:
        """Sends a submit of ``proxy``'s model; the request's id (its answer goes to ``proxy``)."""
        assert self._writer is not None
        rid = self._next_id
        self._next_id += 1
        self._owners[rid] = proxy
        self._writer.send(("submit", rid, proxy.name, *message))
        return rid

    @property
    def writable(self) -> bool:
        """Whether submits can be sent: started and connected."""
        return self._writer is not None and self.connected

    def close_nowait(self, name: str) -> list[asyncio.Task[None]]:
        """Model ``name``'s proxy stops; the connection closes with the last one.

        Returns:
            The reader task once the connection closes (it fails what is
            unanswered with ``ModelNotReady`` as it ends); after the loop has
            closed, only the socket is closed.
        """
        self._open.discard(name)
        if self._open:
            return []
        self.stopping = True  # a stop, not the owner going away: no liveness alarm
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
                proxy = self._owners.pop(message[1], None)
                if proxy is not None:
                    proxy.settle_safely(*message[1:])
            elif message[0] == "state" and len(message) == 4:
                proxy = self._proxies.get(message[1])
                if proxy is not None:
                    proxy.told(int(message[2]), bool(message[3]))
        self.connected = False
        if not self.stopping:
            logger.error("the device owner is gone; liveness fails")
            self._on_owner_gone()
        self._owners.clear()
        for proxy in self._proxies.values():
            proxy.owner_gone()


class BatcherProxy:
    """One model's batcher in the device owner, as seen from one front end.

    A :class:`~predictor.batching.batcher.Batcher`; made by :meth:`OwnerLink.proxy`.

    Args:
        link: The front end's connection to the owner.
        slab: This front end's slab for the model, attached.
        name: The model's name (the owner's batcher it reaches, messages).
        retry_after_s: ``Retry-After`` of a refusal for want of a free slot.
        on_reject: Told the tiles of a refusal for want of a free slot (the
            metrics' ``rejected``, as the real batcher's observer is told).
    """

    def __init__(
        self,
        link: OwnerLink,
        slab: Slab,
        name: str,
        retry_after_s: float,
        on_reject: Callable[[int], None] = lambda n: None,
    ) -> None:
        self._link = link
        self._on_reject = on_reject
        self._slab = slab
        self.name = name
        self._retry_after_s = retry_after_s
        self._pending: dict[int, tuple[list[asyncio.Future[Any]], list[int]]] = {}
        self._owner_depth = 0
        self._owner_live = True
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def queue_depth(self) -> int:
        """The owner's queue depth at its last answer (its batcher enforces the real bound)."""
        return self._owner_depth

    @property
    def healthy(self) -> bool:
        """False once the device owner is gone or says this model's device is unusable."""
        return self._link.connected and self._owner_live

    @property
    def workers(self) -> tuple[Any, ...]:
        """None here: the device workers live in the device owner."""
        return ()

    async def start(self) -> None:
        """Starts the front end's link to the owner (once, whichever model asks first)."""
        await self._link.start()

    def tell_serving(self) -> None:
        """Tells the device owner this front end serves (its ports listen, its models are built)."""
        self._link.tell_serving()

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
        if not self.healthy or self._draining or not self._link.writable:
            raise ModelNotReady(f"{self.name}: the device owner is not serving")
        if not items:
            return []
        slots = self._slab.take(len(items))
        if slots is None:
            self._on_reject(len(items))
            raise Overloaded(
                f"{self.name}: queue full ({len(items)} tiles do not fit this front end's "
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
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        traceparent = tracing.traceparent_of(items[0].trace) if tracing.enabled() else None
        rid = self._link.send_submit(self, (key, priority, deadline, descs, traceparent))
        self._pending[rid] = (futures, slots)
        self._idle.clear()
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
            late = ModelNotReady(f"{self.name}: draining deadline passed")
            for futures, _ in self._pending.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(late)
            return False
        return True

    async def close(self) -> None:
        """Stops this model's proxy; unanswered items fail with ``ModelNotReady``."""
        tasks = self.close_nowait()
        if tasks:
            await asyncio.wait(tasks)

    def close_nowait(self) -> list[asyncio.Task[None]]:
        """:meth:`close` for a model's synchronous ``stop`` (the batcher's contract).

        The connection closes with the front end's last model: its reader
        then fails what is unanswered with ``ModelNotReady`` (at the loop's
        next turns).
        """
        self._draining = True
        return self._link.close_nowait(self.name)

    def told(self, depth: int, live: bool) -> None:
        """The owner's word on this model: its queue depth and liveness."""
        self._owner_depth = depth
        self._owner_live = live

    def owner_gone(self) -> None:
        """The connection ended: whatever is unanswered fails with ``ModelNotReady``."""
        gone = ModelNotReady(f"{self.name}: the device owner is gone")
        for futures, _ in self._pending.values():
            for future in futures:
                if not future.done():
                    future.set_exception(gone)
        self._pending.clear()
        self._idle.set()

    def settle_safely(self, rid: int, *answer: Any) -> None:
        """Settles request ``rid`` from its answer; if reading it fails, it fails (a 503)."""
        try:
            self._settle(rid, *answer)
        except Exception as exc:
            logger.exception("%s: reading the device owner's answer failed", self.name)
            futures, slots = self._pending.pop(rid, ([], []))
            failed = ForwardError(f"{self.name}: the answer could not be read: {exc}")
            for future in futures:
                if not future.done():
                    future.set_exception(failed)
            self._slab.give_back(slots)
            if not self._pending:
                self._idle.set()

    def _settle(self, rid: int, depth: int, live: bool, outcomes: list[tuple[Any, ...]]) -> None:
        self.told(depth, live)
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
