"""The front ends' keeper: one waiter for every child, exit codes as they are, a restart budget."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from pathlib import Path

import pytest

from harness.waiting import wait_until
from predictor.multiprocess.children import Child, Children, RestartPolicy

SETTLED = "open(sys.argv[1], 'w').close()\ntime.sleep(60)"
"""How each script ends: it writes the file named by its argument once its handler is set."""
SLEEPER = f"import sys, time\n{SETTLED}"


def _python(script: str, ready: Path) -> list[str]:
    return [sys.executable, "-c", script, str(ready)]


async def _settled(ready: Path) -> None:
    """Until the child has written ``ready``: its signal handler is set from then on."""
    await asyncio.to_thread(wait_until, ready.exists, f"the child to write {ready}")


async def _run_many(n: int) -> dict[int, int]:
    seen: dict[int, int] = {}
    children = Children(
        lambda i: ["/bin/sh", "-c", f"exit {i % 7}"],
        [],
        lambda c, code: seen.setdefault(c.index, code),
    )
    spawned = [children.spawn(i) for i in range(n)]
    await asyncio.wait([c.exited for c in spawned], timeout=30)
    return seen


def test_one_waiter_reaps_more_children_than_the_default_executor_has_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[threading.Thread] = []  # threads this test's loop started, by identity
    here, start = threading.current_thread(), threading.Thread.start

    def recording_start(thread: threading.Thread) -> None:
        if threading.current_thread() is here:  # not another test's threads, whatever they do
            started.append(thread)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", recording_start)
    seen = asyncio.run(_run_many(40))  # default executor: min(32, CPUs + 4)
    assert seen == {i: i % 7 for i in range(40)}
    assert not started, [t.name for t in started]  # no thread per child (none at all)


async def _stop(script: str, ready: Path) -> list[int]:
    children = Children(lambda i: _python(script, ready), [], lambda c, code: None)
    child: Child = children.spawn(0)
    assert child.proc.stdout is None
    await _settled(ready)
    return await children.stop_all(timeout_s=10)


def test_stop_reports_each_exit_code_as_it_is(tmp_path: Path) -> None:
    assert asyncio.run(_stop(SLEEPER, tmp_path / "sleeper")) == [-signal.SIGTERM]
    failing = f"import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n{SETTLED}"
    assert asyncio.run(_stop(failing, tmp_path / "failing")) == [3]


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    stubborn = f"import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n{SETTLED}"
    ready = tmp_path / "stubborn"

    async def run() -> list[int]:
        children = Children(lambda i: _python(stubborn, ready), [], lambda c, code: None)
        children.spawn(0)
        await _settled(ready)
        return await children.stop_all(timeout_s=0.5)  # its grace: SIGKILL follows

    assert asyncio.run(run()) == [-signal.SIGKILL]


def test_restarts_back_off_and_stop_past_the_budget() -> None:
    async def delays() -> list[float | None]:
        children = Children(lambda i: [], [], lambda c, code: None, RestartPolicy(max_restarts=5))
        return [children.restart_delay() for _ in range(7)]

    assert asyncio.run(delays()) == [0.5, 1.0, 2.0, 4.0, 8.0, None, None]


def test_a_child_reaped_behind_the_waiter_still_reports_its_exit() -> None:
    """``Popen.poll`` (or ``send_signal``, which polls) reaping first left the waiter hanging."""

    async def run() -> int:
        codes: list[int] = []
        children = Children(
            lambda i: ["/bin/sh", "-c", "exit 4"], [], lambda c, code: codes.append(code)
        )
        child = children.spawn(0)
        while child.proc.poll() is None:  # reaps it here, before the loop's reader runs
            await asyncio.sleep(0)  # yields without letting a time pass
        await asyncio.wait_for(child.exited, 5)
        return codes[0]

    assert asyncio.run(run()) == 4
