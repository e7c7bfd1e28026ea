"""The supervisor's stop: how a front end's end counts toward the pod's exit code."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

from predictor.frontends.supervisor import Supervisor


def _exit_codes_after_stop(script: str) -> list[int]:
    supervisor = Supervisor(model=Any, count=1, argv=[], layout=Any, drain_timeout_s=5.0)  # type: ignore[arg-type]
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"  # handler set
    supervisor._children[0] = child
    asyncio.run(supervisor._stop_frontends())
    return supervisor._exit_codes


def test_a_front_end_ended_by_the_sigterm_while_starting_is_a_clean_exit():
    """No handler yet means no listener yet: it admitted nothing, so the pod exits 0."""
    assert _exit_codes_after_stop("import time; print('ready', flush=True); time.sleep(60)") == [0]


def test_a_front_end_that_fails_its_drain_still_fails_the_pod():
    script = (
        "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
        "print('ready', flush=True)\ntime.sleep(60)"
    )
    assert _exit_codes_after_stop(script) == [3]
