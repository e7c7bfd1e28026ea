"""A repository load's thread: lower OS priority than the server's, its result or error handed back."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from predictor.repository.background import LOAD_NICE, run_lowered

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread niceness: Linux"
)


def _where() -> tuple[int, int]:
    tid = threading.get_native_id()
    return tid, os.getpriority(os.PRIO_PROCESS, tid)


def test_the_load_runs_in_its_own_thread_at_a_lower_priority_and_the_caller_keeps_its_own():
    async def body() -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        before = _where()
        inside = await run_lowered(_where)
        return before, inside, _where()

    (tid, nice), (load_tid, load_nice), after = asyncio.run(body())
    assert load_tid != tid
    assert load_nice == min(19, nice + LOAD_NICE)
    assert after == (tid, nice)


def test_a_failed_load_raises_in_the_awaiting_task():
    def fail() -> None:
        raise ValueError("no package")

    with pytest.raises(ValueError, match="no package"):
        asyncio.run(run_lowered(fail))
