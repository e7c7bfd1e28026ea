"""Two lanes per CUDA instance: batch k+1's host staging and copy overlap batch k's forward.

One device worker is serial: stack the tiles into pinned memory, copy them
to the device, normalise, run, copy back, and only then start the next
batch's staging. For ViT-B at batch 64 the staging is about a third of the
forward, so the GPU would idle that long between batches. So each CUDA
instance is served by two batcher workers, its **lanes**, that share one
:class:`Turn` (the instance's compute stream and a lock) and one copy
stream, each with its own normaliser (so its own pinned staging buffer:
double-buffered staging):

1. a lane's batch starts on the copy stream (:meth:`Lane.running`): its
   tiles are stacked into the lane's pinned buffer and copied to the device
   there, while the other lane's forward runs;
2. once staged, the normaliser hands over (:meth:`Lane.handoff`): an event
   is recorded on the copy stream, the lane takes the turn (waits for the
   other lane's batch to end), makes the compute stream current and has it
   wait for the event (no host wait), and the copied batch is marked as used
   on the compute stream for the allocator;
3. normalisation, the forward and the copy back run on the compute stream;
   the lane synchronises it and gives the turn back.

A lane's pinned buffer is written again only by its own next batch, after
its last one was synchronised, so no copy ever reads a buffer being
rewritten. Forwards of one instance never overlap (one model copy per
instance is enough); the compute stream idles only for a launch between
batches. A family that never stages tiles through the normaliser runs its
whole forward on the copy stream, outside the turn: still correct.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Protocol

import torch


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

    def keep(self, tensor: torch.Tensor) -> None:
        """Marks ``tensor`` (made on another stream) as used on this one."""


class Turn:
    """One instance's compute: the stream its lanes' forwards run on, taken one lane at a time."""

    def __init__(self, compute: PipeStream) -> None:
        self.compute = compute
        self._lock = threading.Lock()

    @contextmanager
    def taken(self) -> Iterator[None]:
        """Held while one lane's batch computes; the other lane's next batch stages meanwhile."""
        with self._lock:
            yield


class Lane:
    """One of an instance's two lanes: the shared copy stream and turn; one thread uses it.

    Args:
        copy: The instance's copy stream (both lanes' host-to-device copies).
        turn: The instance's compute stream and lock.
    """

    def __init__(self, copy: PipeStream, turn: Turn) -> None:
        self.copy = copy
        self.turn = turn
        self._stack: ExitStack | None = None
        self._thread: int | None = None  # the thread running the lane's batch
        self._computing = False

    @property
    def stream(self) -> PipeStream:
        """The stream the lane's forwards run on (the instance's compute stream)."""
        return self.turn.compute

    @contextmanager
    def running(self) -> Iterator[None]:
        """One batch: staging on the copy stream, the rest in turn (after :meth:`handoff`).

        On success the stream the work went to is synchronised before the
        turn is given back; on a failure the turn is given back at once (the
        worker synchronises the device to classify the error).
        """
        with self.copy.active(), ExitStack() as stack:
            self._stack, self._computing = stack, False
            self._thread = threading.get_ident()
            try:
                yield
                (self.turn.compute if self._computing else self.copy).synchronize()
            finally:
                self._stack, self._thread, self._computing = None, None, False

    def handoff(self, staged: torch.Tensor) -> None:
        """The batch is staged (its copy queued on the copy stream): take the turn and compute.

        Called by the lane's normaliser between staging and normalisation;
        outside :meth:`running` (or from another thread: the model's own
        normaliser used off a worker), or a second time in one batch, it
        does nothing.
        """
        if self._stack is None or self._computing or self._thread != threading.get_ident():
            return
        copied = self.copy.record()
        self._stack.enter_context(self.turn.taken())
        self._stack.enter_context(self.turn.compute.active())
        self.turn.compute.wait(copied)
        self.turn.compute.keep(staged)
        self._computing = True


def lanes(copy: PipeStream, compute: PipeStream) -> tuple[Lane, Lane]:
    """An instance's two lanes over one copy stream and one compute stream."""
    turn = Turn(compute)
    return Lane(copy, turn), Lane(copy, turn)
