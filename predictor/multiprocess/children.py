"""The front-end processes of one pod: started, reaped by one waiter, restarted under a budget.

Each child is watched through a ``pidfd`` registered with the event loop
(what asyncio's own ``PidfdChildWatcher`` does): no thread per child, and the
exit is reaped with one ``waitpid`` when the descriptor turns readable.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RestartPolicy:
    """When a child that died while serving is started again, and when to give up.

    Attributes:
        max_restarts: Restarts allowed within ``window_s``; one more stops the pod.
        window_s: The window the restarts are counted in.
        first_backoff_s: Delay before the first restart; doubles per recent restart.
        max_backoff_s: The longest delay.
    """

    max_restarts: int = 5
    window_s: float = 60.0
    first_backoff_s: float = 0.5
    max_backoff_s: float = 8.0


@dataclass
class Child:
    """One running front end."""

    index: int
    proc: subprocess.Popen
    exited: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Children:
    """Starts front ends and reports each exit once, with its exit code.

    Args:
        command: The argv of front end ``index``.
        pass_fds: Descriptors every child inherits (the listening HTTP socket).
        on_exit: Called with ``(child, exit code)`` once a child is reaped
            (a signal's death is ``-signal``).
        policy: The restart budget (:meth:`restart_delay`).
    """

    def __init__(
        self,
        command: Callable[[int], list[str]],
        pass_fds: Sequence[int],
        on_exit: Callable[[Child, int], None],
        policy: RestartPolicy = RestartPolicy(),
    ) -> None:
        self._command = command
        self._pass_fds = tuple(pass_fds)
        self._on_exit = on_exit
        self._policy = policy
        self._restarts: collections.deque[float] = collections.deque()
        self.live: dict[int, Child] = {}
        """Running children by pid."""

    def spawn(self, index: int) -> Child:
        """Starts front end ``index`` (inheriting stdout, stderr and :attr:`pass_fds`)."""
        proc = subprocess.Popen(self._command(index), pass_fds=self._pass_fds)
        child = Child(index, proc)
        self.live[proc.pid] = child
        pidfd = os.pidfd_open(proc.pid)
        asyncio.get_running_loop().add_reader(pidfd, self._reap, child, pidfd)
        return child

    def _reap(self, child: Child, pidfd: int) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(child.proc.pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped elsewhere (nothing here should): Popen knows the code
            code = child.proc.returncode if child.proc.returncode is not None else -signal.SIGKILL
        child.proc.returncode = code  # reaped here: Popen must not wait again
        self.live.pop(child.proc.pid, None)
        child.exited.set_result(code)
        self._on_exit(child, code)

    def restart_delay(self) -> float | None:
        """The backoff before one more restart, or None once the budget is spent."""
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > self._policy.window_s:
            self._restarts.popleft()
        if len(self._restarts) >= self._policy.max_restarts:
            return None
        delay = self._policy.first_backoff_s * 2 ** len(self._restarts)
        self._restarts.append(now)
        return min(self._policy.max_backoff_s, delay)

    def signal_all(self, sig: int = signal.SIGTERM) -> None:
        """Sends ``sig`` to every child not yet reaped.

        ``os.kill``, not ``Popen.send_signal``: that one polls first, and
        reaping an exited child there would leave this waiter with nothing
        to reap. An exited child not yet reaped is a zombie of ours, so its
        pid cannot have been reused.
        """
        for child in list(self.live.values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.proc.pid, sig)

    async def stop_all(self, timeout_s: float) -> list[int]:
        """SIGTERM to every child, SIGKILL to what is left after ``timeout_s``; their exit codes."""
        children = list(self.live.values())
        if not children:
            return []
        self.signal_all(signal.SIGTERM)
        _, late = await asyncio.wait([c.exited for c in children], timeout=timeout_s)
        for child in children:
            if not child.exited.done():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.proc.pid, signal.SIGKILL)
        if late:
            await asyncio.wait(late)
        return [c.exited.result() for c in children]
