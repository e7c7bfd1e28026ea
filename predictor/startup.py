"""Start-up assembly: from a :class:`ModelConfig` to a loaded, checked model.

Chooses the checkpoint (the named file, or the package of the model
directory's package set that fits this host, :mod:`predictor.packages.package_set`;
the choice is logged and served), verifies it (the one SHA-256 of start-up) and reads
its metadata, resolves the spec (embedded in the package, or overridden by
``--spec``), the devices (every visible GPU under ``--device auto``) and the
family class, loads the package once in a child process under
``--load_probe`` (:mod:`predictor.runtime.load_probe`: a native crash, exit or hang on
load is then exit 2 with a message, not a dead server; ``auto`` probes CUDA packages and
any package this host has not loaded before, :mod:`predictor.packages.probe_record`; in a
package set a package that fails its probe gives way to the next fitting one of its
model, logged), loads the package once per device and
hands it to the model (the spec family's class, or the user's
``--model_class``), whose ``load`` then probes it. Every problem raises a
:class:`~predictor.errors.StartupError` with one clear line. The phases'
durations are logged once and served by ``GET /v2/models/{name}/config``
(``startup_seconds``).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch

from predictor.batching.scheduler import DeviceScheduler
from predictor.config import BatchingConfig, LimitsConfig, ModelConfig, RepositoryConfig
from predictor.device.cpus import available_cpus, resolve_instances, threads_per_instance
from predictor.device.faults import parse_fault_spec
from predictor.errors import CheckpointError, IncompatiblePackage, SpecError
from predictor.families import family_for, load_model_class, server_model
from predictor.model.base import BaseServerModel, ServingOptions
from predictor.model.metrics import (
    create_metrics,
    memory_budget_gauge,
    model_memory_gauge,
    series_remover,
)
from predictor.packages.facts import (
    PackageFacts,
    check_batch_size,
    find_candidates,
    inspect_package,
)
from predictor.packages.host import check_host_compat
from predictor.packages.package_set import (
    PackageChoice,
    ServedBatch,
    choose_package,
    missing_hint,
    taken,
)
from predictor.packages.phases import StartupPhases
from predictor.packages.probe_record import ProbeRecord, probe_id
from predictor.repository.memory import MemoryMeter, mib
from predictor.repository.repository import Repository
from predictor.runtime.devices import apply_gpu_settings, resolve_devices
from predictor.runtime.load_probe import probe_load, probe_wanted
from predictor.runtime.loader import open_package
from predictor.spec import METADATA_KEY, ModelSpec, resolve_spec, spec_from_json

logger = logging.getLogger("histoserve")

NO_SCHEDULER_ENV = "HISTOSERVE_BENCH_NO_SCHEDULER"
"""A benchmark switch, not a setting: ``1`` gives a repository's models no shared device
scheduler (each batcher runs its batches as a lone model's does, beside the others'), so
``bench.studies.fairness`` can measure the same server with and without it."""


def resolve_model_spec(metadata: Mapping[str, str], override: str | None) -> ModelSpec:
    """The ``--spec`` override when given, else the spec embedded in the package."""
    if override:
        return resolve_spec(override)
    embedded = metadata.get(METADATA_KEY)
    if embedded is None:
        raise SpecError("the package embeds no histoserve spec; pass --spec NAME|PATH")
    return spec_from_json(embedded)


def served_batching(
    spec: ModelSpec, batching: BatchingConfig, limits: LimitsConfig
) -> BatchingConfig:
    """The batching the model of ``spec`` serves with, known before its package loads: the
    flags as its family resolves them (:meth:`~predictor.model.family.Family.serving_options`:
    a slide head's one slide a forward).

    What start-up checks a package's batch range against, alone and in a package set
    (``max_batch_size``, never the raw flag). The model resolves the same flags by the same
    rule once more with its loaded package (``BaseServerModel.batching``, what every part
    reads), where a family bounds only what no batch range is checked against (a slide's
    tiles and its queue, from the package's own range).
    """
    options = ServingOptions(batching=batching, limits=limits)
    return family_for(spec).serving_options(options, None).batching


def build_model(
    config: ModelConfig,
    batching: BatchingConfig,
    limits: LimitsConfig,
    *,
    scheduler: DeviceScheduler | None = None,
) -> BaseServerModel:
    """Builds and loads the model the config describes (fail-fast, one hash).

    ``scheduler`` is the device scheduler the models of one repository share
    (:func:`build_repository`); None for a lone model.

    Logs the monotonic clock (system-wide on Linux) when start-up begins and
    when the model is built, so a benchmark or supervisor on the same host
    can split process start to ready into imports, phases and server start
    (:mod:`bench.stages.coldstart` parses these two lines).
    """
    logger.info("start-up begins at monotonic %.6f s", time.monotonic())
    devices = resolve_devices(config.device)
    device = devices[0]

    def served_batch(metadata: Mapping[str, str]) -> int:
        spec = resolve_model_spec(metadata, config.spec)
        return served_batching(spec, batching, limits).max_batch_size

    choice = choose_checkpoint(config, device, served_batch)
    phases = StartupPhases()
    record = ProbeRecord.open() if config.load_probe == "auto" else ProbeRecord(None)
    choice, facts, spec, probed = _probed_choice(
        config, device, served_batch, choice, phases, record
    )
    checkpoint = choice.path
    cls = load_model_class(config.model_class) if config.model_class else None
    # Each device's package holds one model copy per instance; each worker
    # gets its own normaliser and, on CUDA, stream (predictor.device.workers).
    cpus = available_cpus()
    instances = resolve_instances(config.instances_per_device, device.type, cpus)
    try:
        with record.loading(probed):  # a load that kills this process: probed again next start
            packages = {
                str(d): open_package(
                    checkpoint, d, facts, phases, runner=config.forward_runner, instances=instances
                )
                for d in devices
            }
    except IncompatiblePackage as exc:  # the only package, or --checkpoint's, does not fit
        if choice.key is None:
            raise
        hint = missing_hint(choice.key, facts.metadata, checkpoint.parent, device)
        raise IncompatiblePackage(f"{exc}{hint}") from exc
    package = replace(packages.pop(str(device)), choice=choice.as_dict())
    apply_gpu_settings(package.device, package.input_dtype, allow_tf32=config.allow_tf32)
    name = config.model_name or spec.name
    options = ServingOptions(
        batching=batching,
        limits=limits,
        preprocess_workers=config.preprocess_workers,
        jpeg_decode=config.jpeg_decode,
        name=name,
        instances_per_device=instances,
        cpu_threads_per_instance=threads_per_instance(device.type, instances, cpus),
        scheduler=scheduler,
    )
    fault_hook = parse_fault_spec(config.fault_injection) if config.fault_injection else None
    model = server_model(
        spec,
        checkpoint.name,
        model_class=cls,
        device=str(device),
        model_root=checkpoint.parent,
        options=options,
        metrics=create_metrics(name),
        fault_hook=fault_hook,
        package=package,
        more_packages=packages,
    )
    model.load()
    logger.info("model built at monotonic %.6f s", time.monotonic())
    return model


def build_repository(
    folders: dict[str, Path],
    configs: tuple[ModelConfig, BatchingConfig, LimitsConfig],
    control: RepositoryConfig,
    drain_timeout_s: float,
) -> tuple[Repository, list[BaseServerModel]]:
    """The repository of a ``--model_dir`` of one folder per model, and the models loaded at start.

    Every model shares the server's devices (``--device``: their first is where
    memory is measured and budgeted) and one device scheduler, which decides
    whose batch runs next by each model's ``weight``. A folder that fails to load is listed
    ``UNAVAILABLE`` with its reason; the others serve.

    Raises:
        StartupError: ``--models`` names no folder, or no model loaded.
    """
    model_config = configs[0]
    scheduler = shared_scheduler()
    meter = MemoryMeter(resolve_devices(model_config.device)[0])
    repository = Repository(
        Path(model_config.model_dir),
        folders,
        configs,
        control,
        functools.partial(build_model, scheduler=scheduler),
        meter,
        drain_timeout_s,
        memory_gauge=model_memory_gauge(),
        forget_series=series_remover(),
    )
    memory_budget_gauge(repository.budget_bytes)
    logger.info(
        "model repository %s: %s (control %s, memory budget %s)",
        model_config.model_dir,
        ", ".join(folders),
        control.model_control,
        mib(repository.budget_bytes),
    )
    return repository, repository.load_at_start()


def shared_scheduler(environ: Mapping[str, str] = os.environ) -> DeviceScheduler | None:
    """The device scheduler a repository's models share; None (logged) under the benchmark
    switch :data:`NO_SCHEDULER_ENV` set to ``1``."""
    if environ.get(NO_SCHEDULER_ENV) == "1":
        logger.warning(
            "%s=1: the models share no device scheduler (a benchmark switch)", NO_SCHEDULER_ENV
        )
        return None
    return DeviceScheduler()


def _probed_choice(
    config: ModelConfig,
    device: torch.device,
    served_batch: ServedBatch,
    choice: PackageChoice,
    phases: StartupPhases,
    record: ProbeRecord,
) -> tuple[PackageChoice, PackageFacts, ModelSpec, str]:
    """The chosen package, hashed, read and probed under ``--load_probe``; in a package set,
    the next fitting package of the model when one fails its probe (logged).

    ``served_batch``: the most items the model puts in one forward of a package
    (:func:`served_batching`), which its batch range must hold.

    Returns:
        The choice served, its facts, its spec and its identity in ``record``.

    Raises:
        CheckpointError: The package (or, in a set, every fitting one) failed its probe;
            names each, the step and the signal or timeout.
    """
    failures: list[str] = []
    while True:
        facts = inspect_package(choice.path, phases, choice.metadata)
        spec = resolve_model_spec(facts.metadata, config.spec)
        check_batch_size(facts.metadata, served_batch(facts.metadata))
        identity = probe_id(facts.sha256, str(device), config.forward_runner)
        wanted = probe_wanted(
            config.load_probe, facts.metadata, loaded_before=record.passed(identity)
        )
        if not wanted:
            if config.load_probe == "auto":
                logger.info(
                    "load probe: %s was loaded on this host before; not probed", choice.path.name
                )
            return choice, facts, spec, identity
        try:
            _probe(config, device, choice, facts, phases)
        except CheckpointError as exc:
            failures.append(str(exc))
            if not choice.fallbacks:
                if len(failures) > 1:
                    raise CheckpointError(
                        f"every fitting package failed its load probe: {' | '.join(failures)}"
                    ) from exc
                raise
            nxt = choice.fallbacks[0].path.name
            logger.error(
                "package: %s failed its load probe; serving the next fitting package of its "
                "model, %s, instead (%s)",
                choice.path.name,
                nxt,
                exc,
            )
            choice = choice.fall_back(str(exc))
            logger.info("package: %s", choice.log_line())
            continue
        record.remember(identity, choice.path)
        return choice, facts, spec, identity


def _probe(
    config: ModelConfig,
    device: torch.device,
    choice: PackageChoice,
    facts: PackageFacts,
    phases: StartupPhases,
) -> None:
    """The load probe of the chosen package (:mod:`predictor.runtime.load_probe`), logged."""
    checkpoint = choice.path
    with phases.time("load_probe"):
        try:  # a host mismatch: its own clear line first, with the missing build
            check_host_compat(facts.metadata, device)
        except IncompatiblePackage as exc:
            if choice.key is None:
                raise
            hint = missing_hint(choice.key, facts.metadata, checkpoint.parent, device)
            raise IncompatiblePackage(f"{exc}{hint}") from exc
        report = probe_load(
            checkpoint,
            str(device),
            facts.metadata,
            runner=config.forward_runner,
            timeout_s=config.load_timeout_s,
        )
    logger.info(
        "load probe: %s loads and runs in a fresh process (%s)",
        checkpoint.name,
        report.summary(),
    )


def choose_checkpoint(
    config: ModelConfig, device: torch.device, served_batch: ServedBatch | None = None
) -> PackageChoice:
    """``--checkpoint``'s file, else the package of ``--model_dir`` that fits (logged).

    ``served_batch``: the most items the model puts in one forward of a candidate
    (:func:`served_batching`), which its batch range must hold; None: not checked.

    Raises:
        CheckpointError: No package, or packages of different models fit.
        IncompatiblePackage: None fits (each candidate's mismatch, the
            missing build key and the command that makes it).
    """
    candidates = find_candidates(Path(config.model_dir), config.checkpoint)
    if config.checkpoint:
        choice = taken(candidates[0], "named by --checkpoint")
    else:
        choice = choose_package(
            Path(config.model_dir), candidates, device, served_batch=served_batch
        )
    logger.info("package: %s", choice.log_line())
    return choice
