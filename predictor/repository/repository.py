"""The models of one server, their states, and the Open Inference Protocol's repository extension.

Triton's model repository extension as tritonclient calls it
(``get_model_repository_index``, ``load_model``, ``unload_model``): an index of
every model folder with its state (``READY``, ``LOADING``, ``UNLOADING``,
``UNAVAILABLE`` and why) and memory, and, under ``--model_control explicit``,
loads and unloads while the other models serve.

- A load goes through start-up's whole path for the folder (its settings
  file, the package choice, the load probe), one load at a time, in a thread
  at a lower OS priority than the serving models' (:mod:`.background`);
  it is refused before loading when the loaded models and the new one's
  smallest package would pass ``--memory_budget``, and undone when its
  measured cost does. A failed load leaves the model ``UNAVAILABLE`` with the
  reason and the others serving.
- An unload withdraws the model from the server first (a request for it is
  then a 503 naming its state; server readiness is the other models'),
  answers every request it had accepted (the model's drain), then stops it,
  frees its memory and removes its series from ``/metrics`` (as a load undone
  does).

The server is given to it as ``publish``/``withdraw`` (KServe's registry,
:mod:`predictor.http.app`); models are built by start-up's function.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor.config import BatchingConfig, LimitsConfig, ModelConfig, RepositoryConfig
from predictor.errors import (
    ConfigError,
    HistoserveError,
    InvalidInput,
    LoadRefused,
    ModelNotReady,
    StartupError,
)
from predictor.repository.background import run_lowered
from predictor.repository.layout import check_name
from predictor.repository.memory import MemoryMeter, mib, smallest_package_bytes
from predictor.repository.settings import model_settings

logger = logging.getLogger("histoserve")

READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"
"""A model's states, Triton's words."""

BuildModel = Callable[[ModelConfig, BatchingConfig, LimitsConfig], Any]
"""Start-up's ``build_model``: configs in, a loaded model out (StartupError on failure)."""


@dataclass
class Entry:
    """One model folder: its state, why, its model while loaded and what it costs."""

    name: str
    folder: Path
    state: str = UNAVAILABLE
    reason: str = "not loaded"
    model: Any = None
    memory_bytes: int | None = None

    def row(self, budget_bytes: int) -> dict[str, Any]:
        """The index's row: Triton's fields, and the memory (histoserve's)."""
        return {
            "name": self.name,
            "version": "1",
            "state": self.state,
            "reason": self.reason,
            "memory_bytes": self.memory_bytes,
            "memory_budget_bytes": budget_bytes,
        }


class Repository:
    """Every model folder of ``--model_dir`` and what is loaded of it.

    Args:
        model_dir: The server's ``--model_dir``.
        folders: ``{name: folder}`` (:func:`predictor.repository.layout.model_folders`).
        configs: The server's model, batching and limits configs (each model's
            settings file overrides the first two).
        control: ``--models``, ``--model_control``, ``--memory_budget``.
        build: Start-up's ``build_model``.
        meter: Measures loads on the models' device.
        drain_timeout_s: Longest an unload waits for the model's accepted requests.
        memory_gauge: Sets (bytes) or, with None, removes a model's memory series.
        forget_series: Removes a model's every series (queue, tiles, stage
            times, ...) once its model is gone (unloaded, or a load undone).
    """

    def __init__(
        self,
        model_dir: Path,
        folders: dict[str, Path],
        configs: tuple[ModelConfig, BatchingConfig, LimitsConfig],
        control: RepositoryConfig,
        build: BuildModel,
        meter: MemoryMeter,
        drain_timeout_s: float,
        memory_gauge: Callable[[str, int | None], None] = lambda name, n: None,
        forget_series: Callable[[str], None] = lambda name: None,
    ):
        self._model_dir = model_dir
        self._folders = dict(folders)
        self._entries = {name: Entry(name, folder) for name, folder in folders.items()}
        self._configs = configs
        self._control = control
        self._build = build
        self._meter = meter
        self.budget_bytes = control.budget_of(meter.total_bytes())
        self._drain_timeout_s = drain_timeout_s
        self._memory_gauge = memory_gauge
        self._forget_series = forget_series
        self._publish: Callable[[Any], None] = lambda model: None
        self._withdraw: Callable[[str], None] = lambda name: None
        self._lock: asyncio.Lock | None = None  # made in the serving loop
        self._running: set[asyncio.Future[Any]] = set()  # loads and unloads under way

    # -- start-up -----------------------------------------------------------------------------
    def load_at_start(self) -> list[Any]:
        """Loads ``--models`` (default: every folder under ``--model_control none``, none
        under ``explicit``), each independently; the loaded models.

        A folder that fails is ``UNAVAILABLE`` with its reason (logged), the
        others load: the server serves what loaded.

        Raises:
            ConfigError: ``--models`` names no model folder of ``--model_dir``.
            StartupError: Nothing loaded while something was asked (each reason).
        """
        every = tuple(self._folders) if self._control.model_control == "none" else ()
        wanted = self._control.models or every  # explicit: only --models, as Triton's mode
        for name in wanted:
            try:
                check_name(name, self._model_dir, self._folders)
            except InvalidInput as exc:
                raise ConfigError(f"--models: {exc}") from exc
        for name in self._folders:
            if name not in wanted:
                self._entries[name].reason = "not in --models"
        for name in wanted:
            try:
                self._load_now(self._entries[name])
            except HistoserveError as exc:
                logger.error("model %s did not load: %s", name, exc)
        loaded = [e.model for e in self._entries.values() if e.state == READY]
        if wanted and not loaded:
            reasons = "; ".join(f"{n}: {self._entries[n].reason}" for n in wanted)
            raise StartupError(f"no model of {self._model_dir} loaded ({reasons})")
        return loaded

    def attach(self, publish: Callable[[Any], None], withdraw: Callable[[str], None]) -> None:
        """The server's hooks: make a model reachable, and unreachable, by its name."""
        self._publish, self._withdraw = publish, withdraw

    # -- what the server asks -----------------------------------------------------------------
    def refusal(self, name: str) -> HistoserveError | None:
        """The error for a request to a model folder not served now (None: not a folder)."""
        entry = self._entries.get(name)
        if entry is None or entry.state == READY:
            return None
        return ModelNotReady(f"model {name!r} is {entry.state} ({entry.reason})")

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model folder (or the ready ones) with its state, reason and memory."""
        rows = [e.row(self.budget_bytes) for e in self._entries.values()]
        return [r for r in rows if r["state"] == READY] if ready_only else rows

    async def load(self, model_name: str) -> dict[str, Any]:
        """Loads ``model_name`` (``--model_control explicit``); a loaded one stays as it is.

        The load runs to its end even when the caller goes away (a client's
        deadline cancels its call, never the load half way): it is a task of
        the repository's, awaited through :func:`asyncio.shield`.

        Raises:
            InvalidInput: Not a model folder's name.
            LoadRefused: Mode ``none``, the model is being loaded or unloaded,
                the budget would pass, or its load failed (the reason).
        """
        entry = self._entry_for_control(model_name, "load")
        return await self._run_whole(self._load(entry))

    async def unload(self, model_name: str) -> dict[str, Any]:
        """Unloads ``model_name``: withdrawn, its accepted requests answered, then freed.

        Runs to its end even when the caller goes away, as :meth:`load` does.

        Raises:
            InvalidInput: Not a model folder's name.
            LoadRefused: Mode ``none``, or the model is being loaded or unloaded.
        """
        entry = self._entry_for_control(model_name, "unload")
        return await self._run_whole(self._unload(entry))

    async def _load(self, entry: Entry) -> dict[str, Any]:
        async with self._serial():
            if entry.state == READY:
                return {"name": entry.name, "load": True}
            await run_lowered(self._load_now, entry, False)
            model = entry.model
            try:
                self._publish(model)
                if hasattr(model, "start_batching"):
                    await model.start_batching()
            except Exception as exc:  # its workers did not start: withdrawn and freed
                logger.exception("model %s: did not start", entry.name)
                self._withdraw(entry.name)
                model.stop()
                entry.model, entry.memory_bytes = None, None
                self._meter.release()
                self._memory_gauge(entry.name, None)
                self._forget_series(entry.name)
                entry.state, entry.reason = UNAVAILABLE, f"did not start: {exc}"
                raise LoadRefused(f"model {entry.name!r} did not start: {exc}") from exc
            entry.state, entry.reason = READY, ""
        return {"name": entry.name, "load": True}

    async def _unload(self, entry: Entry) -> dict[str, Any]:
        async with self._serial():
            if entry.state in (LOADING, UNLOADING):
                raise LoadRefused(
                    f"model {entry.name!r} is {entry.state}: try again when it is done"
                )
            if entry.state != READY:
                return {"name": entry.name, "unload": True}
            model = entry.model
            entry.state, entry.reason = UNLOADING, "unload requested; answering accepted requests"
            self._withdraw(entry.name)
            logger.info("model %s: unloading", entry.name)
            drained = False
            try:
                drained = await model.drain(self._drain_timeout_s, "unload")
            finally:
                model.stop()
                entry.model = None
                del model
                gc.collect()
                self._meter.release()
                entry.state = UNAVAILABLE
                entry.reason = "unloaded" if drained else "unloaded at the drain deadline"
                entry.memory_bytes = None
                self._memory_gauge(entry.name, None)
                self._forget_series(entry.name)
                logger.info("model %s: %s", entry.name, entry.reason)
        return {"name": entry.name, "unload": True}

    async def _run_whole(self, work: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        """``work`` as the repository's own task: a cancelled caller leaves it running."""
        task = asyncio.ensure_future(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)

    # -- inside -------------------------------------------------------------------------------
    def _serial(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _entry_for_control(self, name: str, verb: str) -> Entry:
        check_name(name, self._model_dir, self._folders)
        if self._control.model_control != "explicit":
            raise refused_without_control(verb)
        entry = self._entries[name]
        if entry.state in (LOADING, UNLOADING):
            raise LoadRefused(f"model {name!r} is {entry.state}: try again when it is done")
        return entry

    def _loaded_text(self) -> str:
        loaded = [e for e in self._entries.values() if e.memory_bytes is not None]
        if not loaded:
            return "no model is loaded"
        parts = ", ".join(f"{e.name} {mib(e.memory_bytes or 0)}" for e in loaded)
        return f"loaded: {parts} ({mib(self._held_bytes())} in all)"

    def _held_bytes(self) -> int:
        return sum(e.memory_bytes or 0 for e in self._entries.values())

    def _over_budget(self, name: str, needs: int, what: str) -> LoadRefused:
        """The refusal naming what ``name`` costs, what each loaded model costs, their sum
        and the budget."""
        budget = f"the memory budget of {mib(self.budget_bytes)} (--memory_budget {self._control.memory_budget})"
        loaded = [e for e in self._entries.values() if e.memory_bytes is not None]
        if not loaded:
            return LoadRefused(
                f"model {name!r} not loaded: it {what} {mib(needs)}, over {budget}; "
                "no model is loaded"
            )
        parts = ", ".join(f"{e.name} {mib(e.memory_bytes or 0)}" for e in loaded)
        return LoadRefused(
            f"model {name!r} not loaded: it {what} {mib(needs)}, and with the models loaded "
            f"({parts}) that is {mib(self._held_bytes() + needs)}, over {budget}: "
            "unload one first"
        )

    def _load_now(self, entry: Entry, ready: bool = True) -> None:
        """Builds ``entry``'s model (blocking), measured and held to the budget; ``READY``
        at once, or (``ready`` false) left ``LOADING`` for its caller to start and publish.

        Raises:
            LoadRefused: Over the budget, or the build failed (its reason).
        """
        at_least = smallest_package_bytes(entry.folder)
        if self._held_bytes() + at_least > self.budget_bytes:
            exc = self._over_budget(entry.name, at_least, "needs at least (its package)")
            entry.reason = str(exc)
            raise exc
        entry.state, entry.reason = LOADING, "loading"
        model_config, batching, limits = self._configs
        try:
            model_config, batching = model_settings(
                entry.name, entry.folder, model_config, batching, self._control.settings_dir
            )
            with self._meter.measuring(at_least) as measured:
                model = self._build(model_config, batching, limits)
        except HistoserveError as exc:
            self._forget_series(entry.name)
            entry.state, entry.reason = UNAVAILABLE, f"load failed: {exc}"
            raise LoadRefused(f"model {entry.name!r} did not load: {exc}") from exc
        except Exception as exc:  # a bug in a user's model class: the model's, not the server's
            logger.exception("model %s: load failed", entry.name)
            self._forget_series(entry.name)
            entry.state, entry.reason = UNAVAILABLE, f"load failed: {type(exc).__name__}: {exc}"
            raise LoadRefused(f"model {entry.name!r} did not load: {exc}") from exc
        if self._held_bytes() + measured.bytes > self.budget_bytes:
            model.stop()
            del model
            gc.collect()
            self._meter.release()
            self._forget_series(entry.name)
            exc = self._over_budget(entry.name, measured.bytes, "measured")
            entry.state, entry.reason = UNAVAILABLE, str(exc)
            raise exc
        entry.model, entry.memory_bytes = model, measured.bytes
        entry.state, entry.reason = (READY, "") if ready else (LOADING, "starting")
        self._memory_gauge(entry.name, measured.bytes)
        logger.info(
            "model %s: loaded, %s (%s)", entry.name, mib(measured.bytes), self._loaded_text()
        )


def refused_without_control(verb: str) -> LoadRefused:
    """The refusal of a load or unload under ``--model_control none``."""
    return LoadRefused(
        f"model {verb} is not allowed with --model_control none (every model of "
        f"--model_dir loads at start); start the server with --model_control explicit"
    )


class StartedRepository:
    """A front end's view of the device owner's repository (``--frontends`` > 1, model folders).

    Under ``--model_control none`` (the only control front ends serve: start-up
    refuses ``explicit`` with them) the models are the ones the owner loaded
    at start, for the pod's life: the index is the owner's at start (states,
    reasons, memory), a folder that did not load is refused naming its state,
    and load and unload are refused as the owner's repository refuses them.

    Args:
        model_dir: The server's ``--model_dir``.
        folders: ``{name: folder}``, as the owner found them.
        rows: The owner's index at start (:meth:`Repository.index`).
    """

    def __init__(
        self, model_dir: Path, folders: dict[str, Path], rows: list[dict[str, Any]]
    ) -> None:
        self._model_dir = model_dir
        self._folders = dict(folders)
        self._rows = {row["name"]: dict(row) for row in rows}

    def refusal(self, name: str) -> HistoserveError | None:
        """The error for a request to a model folder the owner does not serve (None: not a folder)."""
        row = self._rows.get(name)
        if row is None or row["state"] == READY:
            return None
        return ModelNotReady(f"model {name!r} is {row['state']} ({row['reason']})")

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model folder (or the ready ones) as the owner listed it at start."""
        rows = [dict(row) for row in self._rows.values()]
        return [r for r in rows if r["state"] == READY] if ready_only else rows

    async def load(self, model_name: str) -> dict[str, Any]:
        """Refused, as the owner's repository refuses it under ``--model_control none``.

        Raises:
            InvalidInput: Not a model folder's name.
            LoadRefused: Always, naming the flag.
        """
        check_name(model_name, self._model_dir, self._folders)
        raise refused_without_control("load")

    async def unload(self, model_name: str) -> dict[str, Any]:
        """Refused, as :meth:`load`."""
        check_name(model_name, self._model_dir, self._folders)
        raise refused_without_control("unload")


class FixedModels:
    """The repository of a one-model ``--model_dir`` (or of models handed in): listed, fixed.

    Its index lists the served models ``READY``; load and unload are refused:
    there are no model folders to load from.
    """

    def __init__(self, models: list[Any]):
        self._models = list(models)

    def refusal(self, name: str) -> HistoserveError | None:
        """None: a name not served is KServe's 404, as ever."""
        return None

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """The served models, each ``READY`` (memory not measured in this layout)."""
        return [
            {"name": m.name, "version": "1", "state": READY, "reason": "", "memory_bytes": None}
            for m in self._models
        ]

    async def load(self, model_name: str) -> dict[str, Any]:
        """Refused: the model directory holds one package, not one folder per model."""
        raise self._refused("load")

    async def unload(self, model_name: str) -> dict[str, Any]:
        """Refused, as :meth:`load`."""
        raise self._refused("unload")

    @staticmethod
    def _refused(verb: str) -> LoadRefused:
        return LoadRefused(
            f"model {verb} is not allowed: --model_dir holds one package (or --checkpoint "
            f"names it); lay out one folder per model and start with --model_control explicit"
        )
