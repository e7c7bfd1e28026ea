"""The parent process under ``--frontends N`` (N > 1): the device owner and its front ends' keeper.

The device owner serves one model (a ``.pt2`` in ``--model_dir``) or every
model a ``--model_dir`` of model folders loaded at start (they share its
device scheduler). :meth:`Supervisor.prepare` runs before any front end
exists, and every problem it finds stops the pod at start-up with one line
(exit 2): a model's outputs that cannot cross processes
(:func:`check_crossable`), stale segments of an earlier container swept, one
slab per front end and model allocated whole (a ``/dev/shm`` too small). The
ports were bound by the CLI already (:mod:`predictor.http.listeners`); each
front end inherits the HTTP socket.

Then :meth:`Supervisor.run` starts every model's batcher, the
:class:`~predictor.multiprocess.owner.DeviceOwner` on a Unix socket in a private
folder, and N front ends (``python -m predictor`` with the same flags), and
waits until each says it serves (its ports bound, its models built).

- Children: one waiter in the event loop (a ``pidfd`` per child, reaped with
  ``waitpid``: no thread per child). A front end that exits before it said
  it serves stops the pod (exit 2: it would only fail again); one that dies
  while serving is started again after a backoff (:data:`RESTARTS`); restarts beyond its budget stop the pod (exit 1). Front ends die with the
  supervisor (``PR_SET_PDEATHSIG``, :func:`~predictor.multiprocess.process.die_with_parent`).
- SIGTERM/SIGINT: forwarded to every front end, which drains as one process
  does; once all have exited, the batchers drain what is left, the owner
  stops, and the process exits 0 (1 if a front end did not exit 0).
- Metrics: every process writes to ``PROMETHEUS_MULTIPROC_DIR``; each front
  end's ``/metrics`` sums them. Logs: children inherit stderr, tagged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from predictor.errors import StartupError
from predictor.model.base import BaseServerModel
from predictor.multiprocess.children import Child, Children, RestartPolicy
from predictor.multiprocess.owner import DeviceOwner
from predictor.multiprocess.process import MULTIPROC_ENV
from predictor.multiprocess.segments import remove_stale_segments
from predictor.multiprocess.shm import Slab, SlotLayout, layout_for

logger = logging.getLogger("histoserve")

READY_TIMEOUT_S = 120.0
"""Longest a front end may take from its start to serving (imports, no package)."""
RESTARTS = RestartPolicy()
"""At most 5 restarts in 60 s, after 0.5 s doubling to 8 s."""
_ELEMENT_BYTES = 8
"""Room per element of an extra input or output in a slot (float64 fits)."""
_TILE_INPUTS = frozenset(
    {"tiles", "pixels", "image_data", "jpeg_tiles", "jpeg_layout", "jpeg_boxes"}
)
_NUMERIC = frozenset(
    {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
    | {"FP16", "FP32", "FP64", "BF16"}
)


def check_crossable(model: BaseServerModel) -> None:
    """Refuses a model whose answers cannot cross processes in fixed slots.

    Raises:
        StartupError: An output that is not a number (``BYTES``), or an extra
            input or output with a dynamic dimension besides the batch axis.
    """
    family = model.family
    if not family.CROSSES_PROCESSES:
        raise StartupError(
            f"--frontends > 1: {type(family).__name__} answers whole requests of any size "
            "(e.g. one slide a request), which fixed shared-memory slots cannot hold; "
            "serve it with --frontends 1"
        )
    types = {o.name: o.datatype for o in family.outputs()}
    shapes = {o.name: list(o.shape) for o in family.outputs()}
    for name in shapes:
        if types.get(name, "BYTES") not in _NUMERIC:
            raise StartupError(
                f"--frontends > 1: output {name!r} is {types.get(name)}; only numeric "
                "outputs cross between processes (serve it with --frontends 1)"
            )
    extras = {i["name"]: i["shape"] for i in model.get_input_types()}
    for name, shape in {**extras, **shapes}.items():
        if name not in _TILE_INPUTS and any(d < 0 for d in shape[1:]):
            raise StartupError(
                f"--frontends > 1: {name!r} has shape {shape}, dynamic beyond the batch axis; "
                "its shared-memory slot cannot be sized (serve it with --frontends 1)"
            )


def slot_layout(model: BaseServerModel, workers: int) -> SlotLayout:
    """Slots for the most tiles one front end can have in flight, sized from the model's description.

    A front end holds at most ``max_queue_size`` tiles staged or queued per
    class of service (its view of the owner's depth may lag by
    :data:`~predictor.multiprocess.owner.STATE_REFRESH_S`: twice that here),
    plus the running batches', as the model resolved its batching (a family
    may bound its batch below the flag).
    """
    batching = model.batching
    extra = sum(
        math.prod(i["shape"][1:]) for i in model.get_input_types() if i["name"] not in _TILE_INPUTS
    )
    outputs = sum(math.prod(o.shape[1:]) for o in model.family.outputs())
    queued = batching.max_queue_size * batching.priority_levels
    slots = 2 * (queued + batching.max_batch_size * max(1, workers))
    return layout_for(
        model.model_spec.tile_size, extra * _ELEMENT_BYTES, outputs * _ELEMENT_BYTES, slots
    )


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
        "batching": model.batching,
        "limits": model.limits,
    }


def make_slabs(layouts: Mapping[str, SlotLayout], count: int) -> list[dict[str, Slab]]:
    """Sweeps stale segments, then allocates, per front end, one slab per model, whole.

    Raises:
        StartupError: ``/dev/shm`` cannot hold them (the message names the size).
    """
    for name in remove_stale_segments():
        logger.info("removed the stale shared-memory segment %s", name)
    slabs: list[dict[str, Slab]] = []
    try:
        for _ in range(count):
            slabs.append({})
            for model, layout in layouts.items():
                slabs[-1][model] = Slab.create(layout)
    except StartupError as exc:
        for made in slabs:
            for slab in made.values():
                slab.close()
        total = sum(layout.slab_bytes for layout in layouts.values()) * count
        raise StartupError(f"{exc} [{count} front ends need {total / 2**20:.0f} MiB]") from exc
    return slabs


class Supervisor:
    """Runs the device owner and keeps N front ends (build it with :meth:`prepare`).

    Args:
        models: The loaded models (their batchers not yet started).
        argv: The command line's flags, handed to each front end.
        slabs: Per front end, one allocated slab per model.
        listeners: The bound HTTP socket (inherited by the front ends) and
            the gRPC reservation (held for the pod's life).
        repository: The model repository the models were loaded from (its
            index is told to every front end); None: one package.
    """

    def __init__(
        self,
        models: Sequence[BaseServerModel],
        argv: Sequence[str],
        slabs: Sequence[Mapping[str, Slab]],
        listeners: tuple[Any, Any],
        repository: Any = None,
    ) -> None:
        self._models = list(models)
        self._argv = list(argv)
        self._slabs = [dict(s) for s in slabs]
        self._http, self._grpc_reservation = listeners
        self._repository = repository
        self._children: Children | None = None
        self._ready: set[int] = set()
        self._all_ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._exit_code = 0
        self._socket_path = Path()

    @classmethod
    def prepare(
        cls,
        models: Sequence[BaseServerModel],
        count: int,
        argv: Sequence[str],
        workers: int,
        listeners: tuple[Any, Any],
        repository: Any = None,
    ) -> Supervisor:
        """Checks every model can cross processes and allocates the slabs.

        Args:
            workers: The device workers (batches in flight) per model.

        Raises:
            StartupError: Outputs that cannot cross, or a ``/dev/shm`` too small.
        """
        for model in models:
            try:
                check_crossable(model)
            except StartupError as exc:
                if len(models) == 1:
                    raise
                raise StartupError(f"model {model.name!r}: {exc}") from exc
        layouts = {model.name: slot_layout(model, workers) for model in models}
        return cls(models, argv, make_slabs(layouts, count), listeners, repository)

    def run(self, drain_timeout_s: float) -> int:
        """Serves until SIGTERM and every process's drain; the exit code."""
        with tempfile.TemporaryDirectory(prefix="histoserve-owner-") as folder:
            self._socket_path = Path(folder) / "owner.sock"
            return asyncio.run(self._run(drain_timeout_s))

    async def _run(self, drain_timeout_s: float) -> int:
        for model in self._models:
            await model.start_batching()
        index = await self._repository.index() if self._repository is not None else None
        info = {"models": [frontend_info(m) for m in self._models], "index": index}
        models = {m.name: m for m in self._models}
        owner = DeviceOwner(models, self._slabs, self._socket_path, info, self._on_ready)
        await owner.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        children = Children(self._command, [self._http.fileno()], self._on_exit, RESTARTS)
        self._children = children
        for index in range(len(self._slabs)):
            self._spawn(index)
        if await self._wait_ready():
            logger.info("%d front ends serving", len(self._slabs))
            await self._stopping.wait()
        stopped_at = time.monotonic()
        codes = await children.stop_all(drain_timeout_s + 15.0)
        if any(code not in (0, -signal.SIGTERM) for code in codes):
            self._exit_code = self._exit_code or 1
        # What the front ends gave up on at their deadline still runs here: not for long.
        left_s = max(0.0, drain_timeout_s - (time.monotonic() - stopped_at))
        drains = await asyncio.gather(*(m.drain(left_s) for m in self._models))
        drained = all(drains)
        await owner.close()
        for model in self._models:
            model.stop()
        logger.info("device owner stopped (%s)", "drained" if drained else "drain deadline passed")
        return self._exit_code

    def _command(self, index: int) -> list[str]:
        return [
            sys.executable, "-m", "predictor", *self._argv,
            "--frontend_socket", str(self._socket_path), "--frontend_index", str(index),
            "--frontend_http_fd", str(self._http.fileno()), "--frontend_parent", str(os.getpid()),
        ]  # fmt: skip

    async def _wait_ready(self) -> bool:
        """Whether every front end serves before one failed (or missed its deadline) or SIGTERM."""
        ready = asyncio.ensure_future(self._all_ready.wait())
        stopping = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({ready, stopping}, return_when="FIRST_COMPLETED")
        ready.cancel()
        stopping.cancel()
        return self._all_ready.is_set() and not self._stopping.is_set()

    def _spawn(self, index: int) -> None:
        """Starts front end ``index``; it must say it serves within :data:`READY_TIMEOUT_S`."""
        assert self._children is not None
        pid = self._children.spawn(index).proc.pid
        asyncio.get_running_loop().call_later(READY_TIMEOUT_S, self._check_ready, index, pid)

    def _check_ready(self, index: int, pid: int) -> None:
        assert self._children is not None
        if pid in self._children.live and pid not in self._ready and not self._stopping.is_set():
            logger.error(
                "front end %d (pid %d) did not start serving within %.0f s; stopping",
                index, pid, READY_TIMEOUT_S,
            )  # fmt: skip
            self._fail(2)

    def _on_ready(self, pid: int) -> None:
        self._ready.add(pid)
        if len(self._ready) >= len(self._slabs):
            self._all_ready.set()

    def _on_exit(self, child: Child, code: int) -> None:
        _mark_dead(child.proc.pid)
        if self._stopping.is_set():
            return
        pid, index = child.proc.pid, child.index
        if pid not in self._ready:
            logger.error("front end %d (pid %d) exited %d before it served", index, pid, code)
            self._fail(2)
            return
        self._ready.discard(pid)
        assert self._children is not None
        delay = self._children.restart_delay()
        if delay is None:
            logger.error(
                "front end %d (pid %d) exited %d: more than %d restarts in %.0f s; stopping",
                index, pid, code, RESTARTS.max_restarts, RESTARTS.window_s,
            )  # fmt: skip
            self._fail(1)
            return
        logger.error("front end %d (pid %d) exited %d; again in %.1f s", index, pid, code, delay)
        asyncio.get_running_loop().call_later(delay, self._restart, index)

    def _restart(self, index: int) -> None:
        if not self._stopping.is_set():
            self._spawn(index)

    def _fail(self, code: int) -> None:
        self._exit_code = code
        self._stopping.set()


def _mark_dead(pid: int) -> None:
    """Drops a dead process's live gauges from the summed metrics."""
    from prometheus_client import multiprocess

    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(pid)
