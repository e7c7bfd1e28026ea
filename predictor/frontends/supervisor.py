"""The parent process under ``--frontends N`` (N > 1): the device owner and its front ends' keeper.

It loads the model as one process does (fail-fast), starts the model's
batcher and the :class:`~predictor.frontends.owner.DeviceOwner` on a Unix
socket in a private folder, then starts N front ends
(:mod:`predictor.frontends.frontend`: ``python -m predictor`` with the same
flags) and waits until each has connected before the pod can turn ready.

- SIGTERM/SIGINT: forwarded to every front end, which drains as one process
  does (readiness false, admitted requests finish); once all have exited,
  the batcher drains what is left, the owner stops, and the process exits 0
  (1 if a front end did not exit 0).
- A front end that dies while serving is started again (same index; its
  tiles still in the batcher are settled and dropped, its slab unlinked);
  one that dies before it ever connected stops the pod (exit 2): it would
  only die again.
- Metrics: every process writes to ``PROMETHEUS_MULTIPROC_DIR``
  (:func:`prepare_metrics_dir`, before ``prometheus_client`` is imported);
  each front end's ``/metrics`` sums them.
- Logs: children inherit stderr; every line carries its process's tag
  (:func:`tag_log_lines`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from predictor.config import BatchingConfig
from predictor.frontends.owner import DeviceOwner
from predictor.frontends.process import MULTIPROC_ENV
from predictor.frontends.shm import SlotLayout, layout_for
from predictor.serving.model import BaseServerModel

logger = logging.getLogger("histoserve")

HELLO_TIMEOUT_S = 120.0
"""Longest a front end may take from its start to its connection (imports, no package)."""
_ELEMENT_BYTES = 8
"""Room per element of an extra input or output in a slot (float64 fits)."""


def slot_layout(model: BaseServerModel, batching: BatchingConfig, workers: int) -> SlotLayout:
    """Slots for the most tiles one front end can have in flight, sized from the model's description.

    A front end holds at most ``max_queue_size`` tiles staged or queued
    (counted against the owner's queue depth at its last answer, which may
    lag: twice that here), plus the running batches'. Pages of the slab
    are only used as slots are, last-freed first.
    """
    tile_inputs = {"tiles", "pixels", "image_data"}
    extra = sum(
        _elements(i["shape"]) for i in model.get_input_types() if i["name"] not in tile_inputs
    )
    outputs = sum(_elements(shape) for shape in model.output_shapes().values())
    slots = 2 * (batching.max_queue_size + batching.max_batch_size * max(1, workers))
    return layout_for(
        model.model_spec.tile_size, extra * _ELEMENT_BYTES, outputs * _ELEMENT_BYTES, slots
    )


def _elements(shape: Sequence[int]) -> int:
    return math.prod(max(1, d) for d in shape[1:])


def frontend_info(model: BaseServerModel) -> dict[str, Any]:
    """What a front end needs to serve ``model`` without loading its package."""
    cls = type(model)
    metadata = model.get_metadata()
    checkpoint = Path(metadata["checkpoint"])
    return {
        "spec": model.model_spec.to_json(),
        "model_class": f"{cls.__module__}:{cls.__qualname__}",
        "name": model.name,
        "checkpoint": checkpoint.name,
        "model_root": str(checkpoint.parent),
        "metadata": metadata,
    }


class Supervisor:
    """Runs the device owner and keeps N front ends.

    Args:
        model: The loaded model (its batcher not yet started).
        count: Front ends to run.
        argv: The command line's flags, handed to each front end.
        layout: Every front end's slab layout.
        drain_timeout_s: The front ends' drain deadline (``--drain_timeout_s``).
    """

    def __init__(
        self,
        model: BaseServerModel,
        count: int,
        argv: Sequence[str],
        layout: SlotLayout,
        drain_timeout_s: float,
    ) -> None:
        self._model = model
        self._count = count
        self._argv = list(argv)
        self._layout = layout
        self._drain_timeout_s = drain_timeout_s
        self._children: dict[int, subprocess.Popen] = {}
        self._exit_codes: list[int] = []
        self._connected: set[int] = set()  # pids that said hello
        self._owner: DeviceOwner | None = None
        self._failed = False
        self._stopping = asyncio.Event()
        self._socket_path = Path()

    def run(self) -> int:
        """Serves until SIGTERM and every process's drain; the exit code."""
        with tempfile.TemporaryDirectory(prefix="histoserve-owner-") as folder:
            self._socket_path = Path(folder) / "owner.sock"
            return asyncio.run(self._run())

    async def _run(self) -> int:
        await self._model.start_batching()
        owner = DeviceOwner(
            self._model, self._layout, self._socket_path, frontend_info(self._model)
        )
        await owner.start()
        self._owner = owner
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        for index in range(self._count):
            self._spawn(index)
        if not await self._wait_connected(owner):
            self._stopping.set()
            await self._stop_frontends()
            await owner.close()
            self._model.stop()
            return 2
        logger.info("%d front ends connected", self._count)
        await self._stopping.wait()
        stopped_at = time.monotonic()
        await self._stop_frontends()
        # What the front ends gave up on at their deadline still runs here: not for long.
        left_s = max(0.0, self._drain_timeout_s - (time.monotonic() - stopped_at))
        drained = await self._model.drain(left_s)
        await owner.close()
        self._model.stop()
        logger.info("device owner stopped (%s)", "drained" if drained else "drain deadline passed")
        return 0 if all(code == 0 for code in self._exit_codes) else 1

    def _spawn(self, index: int) -> None:
        command = [
            sys.executable, "-m", "predictor", *self._argv,
            "--frontend_socket", str(self._socket_path), "--frontend_index", str(index),
        ]  # fmt: skip
        proc = subprocess.Popen(command)  # inherits stdout, stderr and the metrics folder
        self._children[index] = proc
        asyncio.get_running_loop().create_task(self._watch(index, proc))

    async def _watch(self, index: int, proc: subprocess.Popen) -> None:
        code = await asyncio.to_thread(proc.wait)
        _mark_dead(proc.pid)
        if self._stopping.is_set():
            return
        if self._owner is None or proc.pid not in self._owner.connected:
            logger.error(
                "front end %d (pid %d) exited %d before it connected", index, proc.pid, code
            )
            self._failed = True
            self._stopping.set()
            return
        logger.error("front end %d (pid %d) exited %d; starting it again", index, proc.pid, code)
        self._spawn(index)

    async def _wait_connected(self, owner: DeviceOwner) -> bool:
        """Whether every front end connected before one exited, SIGTERM or the time ran out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HELLO_TIMEOUT_S
        stopping = loop.create_task(self._stopping.wait())
        try:
            while len(self._connected) < self._count and not self._stopping.is_set():
                hello = loop.create_task(owner.hellos.get())
                await asyncio.wait(
                    {hello, stopping},
                    timeout=max(0.0, deadline - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not hello.done():
                    hello.cancel()
                    break
                self._connected.add(hello.result())
        finally:
            stopping.cancel()
        if len(self._connected) < self._count and not self._stopping.is_set():
            logger.error("a front end did not connect within %.0f s", HELLO_TIMEOUT_S)
        return len(self._connected) == self._count and not self._failed

    async def _stop_frontends(self) -> None:
        """SIGTERM to every front end; waits for their drains (then kills what is left).

        A front end ended *by* the signal was still starting: it installs its
        handler before it listens, so it never admitted a request and lost
        nothing (a clean exit). One that serves drains and exits 0 itself.
        """
        live = [p for p in self._children.values() if p.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = self._drain_timeout_s + 15.0
        for proc in live:
            try:
                code = await asyncio.wait_for(asyncio.to_thread(proc.wait), deadline)
            except asyncio.TimeoutError:
                logger.error("front end pid %d did not exit after its drain; killing it", proc.pid)
                proc.kill()
                code = -signal.SIGKILL
            self._exit_codes.append(0 if code == -signal.SIGTERM else code)


def _mark_dead(pid: int) -> None:
    """Drops a dead process's live gauges from the summed metrics."""
    from prometheus_client import multiprocess

    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(pid)
