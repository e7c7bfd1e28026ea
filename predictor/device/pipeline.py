"""Two lanes per CUDA instance: the compute stream never waits for Python between batches.

One device worker is serial: stack the tiles into pinned memory, copy them
to the device, normalise, run, copy back, build the answers, and only then
start the next batch's staging. So each CUDA instance is served by two
device workers, its **lanes**, that share one :class:`Turn` (the
instance's compute stream and a lock) and one copy stream, each with its
own normaliser (so its own pinned staging buffer: double-buffered staging):

1. a lane's batch starts on the copy stream (:meth:`Lane.running`): its
   tiles are stacked into the lane's pinned buffer and copied to the device
   there, while the other lane's forward runs;
2. once staged, the normaliser hands over (:meth:`Lane.handoff`) with the
   event its copy recorded: the lane takes the turn (waits for the other
   lane's launches to end), makes the compute stream current and has it
   wait for the event (no host wait), and the copied batch is marked as
   used on the compute stream for the allocator;
3. normalisation, the forward and a non-blocking copy of the outputs into
   pinned host memory are queued on the compute stream; then the lane
   gives the turn back (:meth:`Lane.release`): it records an event, hands
   the turn over and only then waits for that event (GIL released) and
   builds the answers, while the other lane already queues its forward
   behind this one. The compute stream always has the next batch queued.

A lane's staging buffer is written again only after the copy-finished event
of its last batch (:class:`~predictor.device.normalizer.Normalizer`). The
lanes' forwards are launched one at a time but run back to back on the one
compute stream, so the instance's package holds one model copy per lane:
AOTInductor's container lends each run a copy and, with none free, blocks
the launching thread until the oldest run's event (``num_runners``, see
:mod:`predictor.runtime.runners`). A family that never stages through the
normaliser hands the turn over itself (:meth:`DeviceSlot.staged`); one that
does not runs its whole forward on the copy stream, outside the turn: still
correct. One that never releases the turn keeps it until its batch ends and
the compute stream is synchronised (the serial order, still correct).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Protocol

import torch

LANES = 2
"""Lanes (device workers) per pipelined CUDA instance."""


class PipeStream(Protocol):
    """What a lane needs of a stream (:class:`~predictor.device.streams.WorkerStream`, or a fake)."""

    def active(self) -> AbstractContextManager[Any]:
        """A context in which the calling thread's device work goes to this stream."""

    def synchronize(self) -> None:
        """Blocks until everything queued on this stream has finished."""

    def record(self) -> Any:
        """An event marking the work queued on this stream so far."""

    def wait(self, event: Any) -> None:
        """Work queued from now on waits for ``event`` on the device."""

    def wait_host(self, event: Any) -> None:
        """Blocks the calling thread (GIL released) until ``event`` has completed."""

    def keep(self, tensor: torch.Tensor) -> None:
        """Marks ``tensor`` (made on another stream) as used on this one."""


class Turn:
    """One instance's compute: the stream its lanes' forwards go to, launched one lane at a time."""

    def __init__(self, compute: PipeStream) -> None:
        self.compute = compute
        self._lock = threading.Lock()

    @contextmanager
    def taken(self) -> Iterator[None]:
        """Held while one lane queues its batch's compute; the other lane stages meanwhile."""
        with self._lock:
            yield

    @property
    def held(self) -> bool:
        """Whether some lane holds the turn now (for tests and logs)."""
        return self._lock.locked()


class Lane:
    """One of an instance's two lanes: the shared copy stream and turn; one thread uses it.

    Args:
        copy: The instance's copy stream (both lanes' host-to-device copies).
        turn: The instance's compute stream and lock.
    """

    def __init__(self, copy: PipeStream, turn: Turn) -> None:
        self.copy = copy
        self.turn = turn
        self._thread: int | None = None  # the thread running the lane's batch
        self._held: ExitStack | None = None  # the turn and the compute stream, while held
        self._computed = False

    @property
    def stream(self) -> PipeStream:
        """The stream the lane's forwards run on (the instance's compute stream)."""
        return self.turn.compute

    @contextmanager
    def running(self) -> Iterator[None]:
        """One batch: staging on the copy stream, the rest in turn (after :meth:`handoff`).

        On success a turn still held is kept until the compute stream is
        synchronised (the family did not :meth:`release` it); a batch that
        never took the turn synchronises the copy stream. On a failure the
        turn is given back at once (the worker synchronises the device to
        classify the error).
        """
        with self.copy.active():
            self._thread, self._computed = threading.get_ident(), False
            try:
                yield
                if self._held is not None:
                    self.turn.compute.synchronize()
                elif not self._computed:
                    self.copy.synchronize()
            finally:
                self._give_back()
                self._thread = None

    def handoff(self, staged: torch.Tensor, copied: Any = None) -> None:
        """The batch is staged (its copy queued on the copy stream): take the turn and compute.

        ``copied`` is the copy's event when the stager recorded one (else one
        is recorded now). Called by the lane's normaliser between staging and
        normalisation; outside :meth:`running` (or from another thread: the
        model's own normaliser used off a worker), or while the turn is held
        already, it does nothing.
        """
        if self._thread != threading.get_ident() or self._held is not None:
            return
        if copied is None:
            copied = self.copy.record()
        held = ExitStack()
        held.enter_context(self.turn.taken())
        held.enter_context(self.turn.compute.active())
        self._held = held
        self.turn.compute.wait(copied)
        self.turn.compute.keep(staged)
        self._computed = True

    def release(self) -> bool:
        """The batch's work is queued: give the turn back, then wait for that work.

        Records an event on the compute stream, gives the turn (and the
        compute stream's currency) back, and only then blocks on the event,
        so the other lane queues its forward while this one waits and builds
        its answers. ``False`` (nothing done) when this thread holds no turn:
        the caller synchronises its own stream.
        """
        if self._thread != threading.get_ident() or self._held is None:
            return False
        done = self.turn.compute.record()
        self._give_back()
        self.turn.compute.wait_host(done)
        return True

    def _give_back(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.close()


def lanes(copy: PipeStream, compute: PipeStream) -> tuple[Lane, Lane]:
    """An instance's two lanes over one copy stream and one compute stream."""
    turn = Turn(compute)
    return Lane(copy, turn), Lane(copy, turn)
