"""Which device (and stream) is current for the calling thread whenever it calls into a package.

An AOTInductor model container sets the CUDA device in its constructor and
never restores it (``aoti_runtime/model_base.h``), and its ``run`` creates its
completion event lazily on whatever device is current, then records it on the
container's stream. Loading the packages for ``cuda:0``, ``cuda:1``, ... in
turn therefore leaves the last GPU current, and a probe or forward of
``cuda:0``'s package run from there creates that event on the wrong device:
every later batch of that worker fails with ``invalid resource handle``.

So every call into a package (load, probe, warm-up, forward, copy back) runs
inside :func:`on_device` with the package's own device current and, for a
device worker, that worker's stream. On the CPU the real context does
nothing. Tests that cannot have a GPU inject a recorder
(:func:`use_device_context`) that records what was current at each call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Protocol

import torch


class StreamLike(Protocol):
    """What a device worker needs of its stream (a CUDA stream's wrapper, or a test's fake)."""

    def active(self) -> AbstractContextManager[Any]:
        """A context in which the calling thread's work on the device goes to this stream."""

    def synchronize(self) -> None:
        """Blocks until everything queued on this stream has finished."""


class DeviceContext(Protocol):
    """Makes ``device`` (and ``stream``, when given) current for the calling thread."""

    def enter(
        self, device: torch.device, stream: StreamLike | None
    ) -> AbstractContextManager[None]:
        """The context; leaving it restores what was current before."""


class CudaDeviceContext:
    """The real context: ``torch.cuda.device`` on CUDA, then the stream's own ``active()``."""

    @contextmanager
    def enter(self, device: torch.device, stream: StreamLike | None) -> Iterator[None]:
        with ExitStack() as stack:
            if device.type == "cuda":
                stack.enter_context(torch.cuda.device(device))
            if stream is not None:
                stack.enter_context(stream.active())
            yield


_ACTIVE: list[DeviceContext] = [CudaDeviceContext()]


def on_device(
    device: torch.device | str, stream: StreamLike | None = None
) -> AbstractContextManager[None]:
    """``device`` current (and ``stream``, when given) for the calling thread inside the block.

    Nests: an inner ``on_device(d)`` without a stream keeps the stream an outer
    block made current for ``d`` (CUDA keeps one current stream per device).
    """
    return _ACTIVE[-1].enter(torch.device(device), stream)


@contextmanager
def use_device_context(context: DeviceContext) -> Iterator[DeviceContext]:
    """Tests: route every :func:`on_device` through ``context`` inside the block."""
    _ACTIVE.append(context)
    try:
        yield context
    finally:
        _ACTIVE.remove(context)
