"""Waiting on a condition, never on a clock: poll it with a short interval up to a generous deadline.

A fixed ``time.sleep`` used as synchronisation is a guess at how long another
thread or process needs (to start a forward, write a file, notice a signal);
on a busy machine the guess is wrong and the test fails for no fault of the
code. Where there is an event to wait on (``threading.Event``,
``Thread.join``, ``Popen.wait``) use it; where the condition lives in another
process (its ``/metrics``, its log, a file) or in state that signals nothing,
:func:`wait_until` polls it. The deadline only bounds a hang when the code is
broken: it is never what the test measures, so it is generous.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TIMEOUT_S = 60.0
"""The default deadline: reached only when the condition never comes (a bug), never on a slow run."""
INTERVAL_S = 0.01
"""The default pause between two looks at the condition."""


def wait_until(
    condition: Callable[[], T],
    what: str,
    *,
    timeout_s: float = TIMEOUT_S,
    interval_s: float = INTERVAL_S,
    detail: Callable[[], str] | None = None,
) -> T:
    """Returns the first truthy value of ``condition()``, polled every ``interval_s``.

    Args:
        condition: Looked at straight away, then after each pause; its first
            truthy result is returned (so it may return what it found).
        what: The condition in words, for the failure message.
        timeout_s: How long to wait at most (a generous bound, not a measure).
        interval_s: The pause between two looks.
        detail: Called on failure for more context (a server's log tail, say).

    Raises:
        AssertionError: ``condition()`` was still falsy after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() >= deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}{extra}")
        time.sleep(interval_s)
