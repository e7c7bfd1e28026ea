"""One CUDA stream per device worker, so one worker's copy and forward overlap another's compute."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import torch


class StreamLike(Protocol):
    """What a device worker needs of its stream (:class:`WorkerStream`, or a test's fake)."""

    def active(self) -> AbstractContextManager[Any]:
        """A context in which the calling thread's work on the device goes to this stream."""

    def synchronize(self) -> None:
        """Blocks until everything queued on this stream has finished."""


class WorkerStream:
    """One device worker's own CUDA stream.

    The AOTInductor loader (``AOTIModelContainerRunnerCuda::run_impl``) runs
    on the current stream of the current device when handed no stream, and
    the normaliser's copy and kernels use the current stream too, so entering
    :meth:`active` around a worker's forward puts its copy, normalisation and
    forward on this stream (and on its device: ``torch.cuda.device`` as well,
    so a worker of ``cuda:1`` never launches on ``cuda:0``'s current stream).

    Torch's pooled streams do not wait for the default stream, so creating
    one first waits for the device: the weights and the normaliser's
    constants, written on the default stream at start-up, are complete
    before this stream reads them.
    """

    def __init__(self, device: torch.device) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"a worker stream needs a CUDA device, got {device}")
        torch.cuda.synchronize(device)
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    @contextmanager
    def active(self) -> Iterator[torch.cuda.Stream]:
        """The stream (and its device) current for the calling thread inside the block."""
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            yield self.stream

    def synchronize(self) -> None:
        """Blocks the calling thread (GIL released) until this stream's work is done."""
        self.stream.synchronize()

    def record(self) -> torch.cuda.Event:
        """An event recorded now on this stream (marks the work queued so far)."""
        return self.stream.record_event()

    def wait(self, event: Any) -> None:
        """Work queued on this stream from now on waits for ``event`` (no host wait)."""
        self.stream.wait_event(event)

    def wait_host(self, event: torch.cuda.Event) -> None:
        """Blocks the calling thread (GIL released) until ``event`` has completed."""
        event.synchronize()

    def keep(self, tensor: torch.Tensor) -> None:
        """Tells the allocator ``tensor`` (made on another stream) is used on this one."""
        if tensor.is_cuda:
            tensor.record_stream(self.stream)


class CurrentStream:
    """The calling thread's current CUDA stream on ``device``, as a fence for one copy.

    A normaliser outside a lane records its copy's event here (on whatever
    stream the worker made current) and waits for it before rewriting its
    staging buffer.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)

    def record(self) -> torch.cuda.Event:
        """An event recorded now on the calling thread's current stream."""
        return torch.cuda.current_stream(self.device).record_event()

    def wait_host(self, event: torch.cuda.Event) -> None:
        """Blocks the calling thread (GIL released) until ``event`` has completed."""
        event.synchronize()


def worker_stream(device: torch.device) -> StreamLike | None:
    """A new stream for one worker on ``device``; ``None`` off CUDA (no streams there)."""
    return WorkerStream(device) if torch.device(device).type == "cuda" else None
