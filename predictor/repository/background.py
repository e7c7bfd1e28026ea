"""A load's blocking work in its own thread at a lower OS priority, awaited from the serving loop.

A model loaded while others serve (``--model_control explicit``) costs the CPU:
the load probe's child process on a first load (``import torch``, the
package's load and one batch: seconds of CPU), then the digest, the package's
load and the family's check of its outputs (a forward at batches of 1 and 2,
the largest part of a reload). At the same priority as the serving models'
device workers, that work takes their cores: reloads back to back on a
server confined to one core cost the serving model 32-68 % of its tiles/s
and up to 3.8x its p99 (``docs/deployment.md``, "Load and unload under
load"). :func:`run_lowered` runs the load in a fresh thread whose niceness
is raised by :data:`LOAD_NICE` (Linux: niceness is per thread, and the probe's
child inherits it), so the serving threads win the cores and the load takes
what they leave (there: 81-120 % of the tiles/s kept, the p99 within 2x).

A thread is made per call and ends with it: a pooled thread would keep the
lowered priority for whatever ran on it next. Threads the load starts inherit
the priority too, so what a model keeps must not be started during its load
(the decode pool starts its threads with its first job:
:class:`predictor.model.stage1.CostOrderedPool`). Elsewhere than Linux (where a
thread's id is not a process's) the thread runs at the caller's priority.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger("histoserve")

T = TypeVar("T")
LOAD_NICE = 10
"""How much a load's thread's niceness is raised over the server's (capped at 19)."""
_MAX_NICE = 19


def lower_this_thread(by: int) -> int | None:
    """Raises the calling thread's niceness by ``by`` (Linux); its niceness, or None
    where a thread's priority cannot be set apart from its process's (or was refused)."""
    if not sys.platform.startswith("linux"):
        return None
    tid = threading.get_native_id()
    try:
        nice = min(_MAX_NICE, os.getpriority(os.PRIO_PROCESS, tid) + by)
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as exc:  # a seccomp profile may refuse it: the load runs as it would
        logger.warning("a load's thread keeps the server's priority (%s)", exc)
        return None
    return nice


async def run_lowered(fn: Callable[..., T], *args: object, by: int = LOAD_NICE) -> T:
    """``fn(*args)`` in a new thread at ``by`` more niceness; its result or its exception.

    The caller's thread keeps its priority. Cancelling the awaiting task does
    not stop ``fn`` (a thread cannot be stopped); its result is then dropped.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, exc: BaseException | None) -> None:
        if done.cancelled():
            return
        if exc is None:
            done.set_result(result)  # type: ignore[arg-type]
        else:
            done.set_exception(exc)

    def run() -> None:
        lower_this_thread(by)
        outcome: tuple[T | None, BaseException | None]
        try:
            outcome = (fn(*args), None)
        except BaseException as exc:  # handed to the awaiting task, raised there
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed (server stopped): no one waits
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name="histoserve-load", daemon=True).start()
    return await done
