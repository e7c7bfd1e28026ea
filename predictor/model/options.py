"""Runtime options of a served model beside its spec (:class:`ServingOptions`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from predictor.batching.scheduler import DeviceScheduler
from predictor.config import BatchingConfig, LimitsConfig


@dataclass(frozen=True)
class ServingOptions:
    """Runtime options beside the spec; built by the CLI, defaults fit tests."""

    batching: BatchingConfig = field(default_factory=BatchingConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    preprocess_workers: int = 2
    jpeg_decode: str = "cpu"
    """``--jpeg_decode`` (:class:`predictor.config.ModelConfig`): ``cpu`` or ``device``."""
    name: str | None = None
    instances_per_device: int = 1
    cpu_threads_per_instance: int | None = None
    """Intra-op threads each CPU device worker sets for itself (None: torch's own count)."""
    scheduler: DeviceScheduler | None = None
    """The process's device scheduler shared by every model of a model repository (None: one model)."""
