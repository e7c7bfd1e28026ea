"""Start-up assembly: from a :class:`ModelConfig` to a loaded, checked model.

Chooses the checkpoint (the named file, or the package of the model
directory's package set that fits this host, :mod:`predictor.pt2.package_set`;
the choice is logged and served), verifies it (the one SHA-256 of start-up) and reads
its metadata, resolves the spec (embedded in the package, or overridden by
``--spec``), the devices (every visible GPU under ``--device auto``) and the
family class, loads the package once in a child process under
``--load_probe`` (:mod:`predictor.pt2.load_probe`: a native crash or hang on
load is then exit 2 with a message, not a dead server), loads the package once per device and
hands it to the model (the spec family's class, or the user's
``--model_class``), whose ``load`` then probes it. Every problem raises a
:class:`~predictor.errors.StartupError` with one clear line. The phases'
durations are logged once and served by ``GET /v2/models/{name}/config``
(``startup_seconds``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch

from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
from predictor.device.cpus import available_cpus, resolve_instances, threads_per_instance
from predictor.device.faults import parse_fault_spec
from predictor.errors import IncompatiblePackage, SpecError
from predictor.families import load_model_class, server_model
from predictor.model.base import BaseServerModel, ServingOptions
from predictor.model.metrics import create_metrics
from predictor.pt2.host import apply_gpu_settings, check_host_compat, resolve_devices
from predictor.pt2.load_probe import probe_load, probe_wanted
from predictor.pt2.loader import (
    StartupPhases,
    check_batch_size,
    find_candidates,
    inspect_package,
    open_package,
)
from predictor.pt2.package_set import PackageChoice, choose_package, missing_hint, taken
from predictor.spec import METADATA_KEY, ModelSpec, resolve_spec, spec_from_json

logger = logging.getLogger("histoserve")


def resolve_model_spec(metadata: Mapping[str, str], override: str | None) -> ModelSpec:
    """The ``--spec`` override when given, else the spec embedded in the package."""
    if override:
        return resolve_spec(override)
    embedded = metadata.get(METADATA_KEY)
    if embedded is None:
        raise SpecError("the package embeds no histoserve spec; pass --spec NAME|PATH")
    return spec_from_json(embedded)


def build_model(
    config: ModelConfig, batching: BatchingConfig, limits: LimitsConfig
) -> BaseServerModel:
    """Builds and loads the model the config describes (fail-fast, one hash).

    Logs the monotonic clock (system-wide on Linux) when start-up begins and
    when the model is built, so a benchmark or supervisor on the same host
    can split process start to ready into imports, phases and server start
    (:mod:`bench.stages.coldstart` parses these two lines).
    """
    logger.info("start-up begins at monotonic %.6f s", time.monotonic())
    devices = resolve_devices(config.device)
    device = devices[0]
    choice = choose_checkpoint(config, device, batching.max_batch_size)
    checkpoint = choice.path
    phases = StartupPhases()
    facts = inspect_package(checkpoint, phases, choice.metadata)
    check_batch_size(facts.metadata, batching.max_batch_size)
    spec = resolve_model_spec(facts.metadata, config.spec)
    if probe_wanted(config.load_probe, facts.metadata):
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
    cls = load_model_class(config.model_class) if config.model_class else None
    # Each device's package holds one model copy per instance; each worker
    # gets its own normaliser and, on CUDA, stream (predictor.device.workers).
    cpus = available_cpus()
    instances = resolve_instances(config.instances_per_device, device.type, cpus)
    try:
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


def choose_checkpoint(
    config: ModelConfig, device: torch.device, max_batch_size: int
) -> PackageChoice:
    """``--checkpoint``'s file, else the package of ``--model_dir`` that fits (logged).

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
            Path(config.model_dir), candidates, device, max_batch_size=max_batch_size
        )
    logger.info("package: %s", choice.log_line())
    return choice
