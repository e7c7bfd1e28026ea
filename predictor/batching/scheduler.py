"""Which model's batch runs next on a device: one :class:`DeviceScheduler` per process, shared fairly.

Contract:
    * Every model's :class:`~predictor.batching.batcher.DynamicBatcher` joins
      the process's scheduler (:meth:`DeviceScheduler.join`) with its
      ``weight`` and its workers' devices, and gets a :class:`Share`. Before
      it cuts a batch for a free worker it asks its share for a *turn* on
      that worker's device; it runs the batch holding the turn and gives it
      back when the batch has ended (:meth:`Turn.release`). The scheduler
      knows no queue, item or protocol: only models, devices and how long each
      turn held its device.
    * A device runs at most ``capacity`` batches at once, the most workers
      any one joined model has on it (a lone model's workers never wait for a
      turn: with one model this reduces to the batcher's own rule).
    * A model asks only when its batch is ready (full, another key follows,
      or its fill wait is over), so no model waits for another's batch to
      fill; the batch is cut when the turn is granted, so it grows while it
      waits.
    * Weighted fair sharing (start-time fair queueing over device time): each
      model has a virtual time per device that grows by each turn's seconds
      divided by its ``weight``; a free slot goes to the waiting model with the
      least virtual time (the oldest request on a tie). A model that was idle
      on the device starts at the device's virtual time, so idleness earns no
      credit and a flooded model cannot starve a trickling one: under
      saturation, device time splits as the weights.
    * A model whose turn ends with another batch ready competes for the slot
      it frees (``again``): when it wins, the slot is *reserved* for it and
      its next :meth:`Share.take` gets it at once; it gives the reservation
      back (:meth:`Share.idle`) when it has nothing to run.
    * Every request is granted, withdrawn or dropped exactly once; a model
      that leaves (:meth:`Share.leave`) hands its slots to the others.

Only the event loop thread touches it (the batchers' dispatchers run there).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["DeviceScheduler", "Share", "Turn"]


@dataclass(eq=False)
class _Request:
    """One model's wait for a turn on any of ``devices``."""

    share: Share
    devices: tuple[str, ...]
    future: asyncio.Future[Turn]
    seq: int


@dataclass(eq=False)
class _Device:
    """One device's slots, virtual time and waiting requests."""

    name: str
    capacity: int = 1
    in_use: int = 0
    vclock: float = 0.0
    waiting: list[_Request] = field(default_factory=list)


class Turn:
    """A slot on ``device`` held by one model's batch; :meth:`release` it once the batch ends."""

    __slots__ = ("_released", "device", "granted_at", "share")

    def __init__(self, share: Share, device: str, granted_at: float) -> None:
        self.share = share
        self.device = device
        self.granted_at = granted_at
        self._released = False

    def release(self, again: bool = False, *, charge: bool = True) -> None:
        """Gives the slot back, charging the model for the time it held it.

        Args:
            again: The model has another batch ready for a worker of this
                device: it competes for the freed slot (reserved when it wins).
            charge: False for a turn that ran nothing (its batch emptied).
        """
        if self._released:
            return
        self._released = True
        seconds = time.monotonic() - self.granted_at if charge else 0.0
        self.share._released(self, seconds, again)


class Share:
    """One model's membership of the scheduler: its weight, virtual times, requests and slots."""

    def __init__(
        self, scheduler: DeviceScheduler, model: str, weight: float, workers: Mapping[str, str]
    ) -> None:
        self.model = model
        self.weight = weight
        self.workers = dict(workers)
        self._scheduler = scheduler
        self._vtime: dict[str, float] = {}
        self._active: dict[str, int] = {}  # device: turns held + reserved + requests waiting
        self._reserved: dict[str, int] = {}
        self._request: _Request | None = None
        self.left = False

    def vtime(self, device: str) -> float:
        """This model's virtual time on ``device`` (device seconds over weight)."""
        return self._vtime.get(device, 0.0)

    def take(self, devices: Sequence[str]) -> Turn | None:
        """A turn on the first of ``devices`` where one is free now (its reservation first), or None."""
        sched = self._scheduler
        for name in devices:
            if self._reserved.get(name):
                self._reserved[name] -= 1
                return Turn(self, name, time.monotonic())
        for name in devices:
            device = sched._devices[name]
            if device.in_use < device.capacity and not device.waiting:
                return sched._grant_to(self, device)
        return None

    async def turn(self, devices: Sequence[str]) -> Turn:
        """A turn on one of ``devices``: at once when free (:meth:`take`), else in fair order.

        Cancelled, the request is withdrawn (a turn granted meanwhile is given back uncharged).
        """
        turn = self.take(devices)
        if turn is not None:
            return turn
        request = self._scheduler._enqueue(self, tuple(devices))
        try:
            return await request.future
        except asyncio.CancelledError:
            self._withdraw(request)
            raise

    def idle(self) -> None:
        """Nothing to run: gives back every slot reserved for this model."""
        sched = self._scheduler
        for name, n in list(self._reserved.items()):
            if not n:
                continue
            self._reserved[name] = 0
            device = sched._devices[name]
            device.in_use -= n
            self._active[name] -= n
            sched._grant(device)

    def leave(self) -> None:
        """Leaves for good (the batcher closed): reservations and the waiting request go."""
        if self.left:
            return
        if self._request is not None:
            self._withdraw(self._request)
        self.idle()
        self.left = True
        self._scheduler._leave(self)

    def _withdraw(self, request: _Request) -> None:
        future = request.future
        if future.done() and not future.cancelled():
            future.result().release(charge=False)
            return
        if not future.done():
            future.cancel()
        self._scheduler._drop(request)

    def _released(self, turn: Turn, seconds: float, again: bool) -> None:
        sched = self._scheduler
        name = turn.device
        device = sched._devices.get(name)
        if device is None:
            return
        self._vtime[name] = self.vtime(name) + seconds / self.weight
        device.in_use -= 1
        pending = self._request is not None and name in self._request.devices
        sched._grant(device, self if again and not pending and not self.left else None)
        self._active[name] -= 1  # after the grant: a winning contender stays active


class DeviceScheduler:
    """The process's device scheduler: every model's batcher asks it for a turn on a device."""

    def __init__(self) -> None:
        self._devices: dict[str, _Device] = {}
        self._shares: list[Share] = []
        self._seq = itertools.count()

    def join(self, model: str, weight: float, workers: Mapping[str, str]) -> Share:
        """Adds a model with its ``weight`` (> 0) and ``workers`` (worker name: device name).

        Raises:
            ValueError: ``weight`` is not above 0, or no worker is given.
        """
        if not weight > 0:
            raise ValueError(f"{model}: weight must be > 0, got {weight}")
        if not workers:
            raise ValueError(f"{model}: no worker to schedule")
        share = Share(self, model, weight, workers)
        self._shares.append(share)
        for name in set(workers.values()):
            device = self._devices.setdefault(name, _Device(name))
            share._vtime[name] = device.vclock
        self._size()
        return share

    def devices(self) -> dict[str, tuple[int, int]]:
        """Each device's ``(in_use, capacity)``, for tests and metrics."""
        return {d.name: (d.in_use, d.capacity) for d in self._devices.values()}

    def _size(self) -> None:
        for device in self._devices.values():
            counts = [sum(1 for d in s.workers.values() if d == device.name) for s in self._shares]
            device.capacity = max([1, *counts])
            self._grant(device)

    def _leave(self, share: Share) -> None:
        if share in self._shares:
            self._shares.remove(share)
        self._size()

    def _activate(self, share: Share, device: _Device) -> None:
        if not share._active.get(device.name):
            share._vtime[device.name] = max(share.vtime(device.name), device.vclock)
        share._active[device.name] = share._active.get(device.name, 0) + 1

    def _grant_to(self, share: Share, device: _Device) -> Turn:
        self._activate(share, device)
        device.in_use += 1
        device.vclock = max(device.vclock, share.vtime(device.name))
        return Turn(share, device.name, time.monotonic())

    def _enqueue(self, share: Share, devices: tuple[str, ...]) -> _Request:
        loop = asyncio.get_running_loop()
        request = _Request(share, devices, loop.create_future(), next(self._seq))
        share._request = request
        for name in devices:
            device = self._devices[name]
            self._activate(share, device)
            device.waiting.append(request)
        return request

    def _drop(self, request: _Request) -> None:
        share = request.share
        if share._request is request:
            share._request = None
        for name in request.devices:
            device = self._devices.get(name)
            if device is not None and request in device.waiting:
                device.waiting.remove(request)
                share._active[name] -= 1

    def _grant(self, device: _Device, contender: Share | None = None) -> None:
        """Fills ``device``'s free slots in fair order; ``contender`` (a model with a batch
        ready whose turn just ended) competes, and wins a reservation."""
        while device.in_use < device.capacity:
            device.waiting = [r for r in device.waiting if not r.future.done()]
            candidates: list[tuple[float, int, Share, _Request | None]] = [
                (r.share.vtime(device.name), r.seq, r.share, r) for r in device.waiting
            ]
            if contender is not None:
                candidates.append((contender.vtime(device.name), -1, contender, None))
                contender = None
            if not candidates:
                return
            _, _, share, request = min(candidates, key=lambda c: (c[0], c[1]))
            if request is None:
                self._grant_to(share, device)
                share._reserved[device.name] = share._reserved.get(device.name, 0) + 1
                continue
            turn = self._grant_to(share, device)
            self._drop(request)
            request.future.set_result(turn)
