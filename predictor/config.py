"""Frozen configuration passed explicitly from the CLI to each part.

Nothing here reads the environment or parses arguments: :mod:`predictor.cli`
builds these once and hands them down, so every part is testable alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from predictor.errors import ConfigError


@dataclass(frozen=True)
class BatchingConfig:
    """How the in-process dynamic batcher forms batches.

    Attributes:
        max_batch_size: Most tiles per forward call.
        max_latency_ms: Longest a queued tile waits for its batch to fill
            while the device is busy; an idle device dispatches at once.
        max_queue_size: Most tiles waiting; beyond it new requests get 503.
        retry_after_s: ``Retry-After`` hint sent with overload 503s.
    """

    max_batch_size: int = 32
    max_latency_ms: float = 5.0
    max_queue_size: int = 1024
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_latency_ms < 0:
            raise ConfigError(f"max_latency_ms must be >= 0, got {self.max_latency_ms}")
        if self.max_queue_size < self.max_batch_size:
            raise ConfigError(
                f"max_queue_size ({self.max_queue_size}) must be >= max_batch_size "
                f"({self.max_batch_size})"
            )
        if self.retry_after_s <= 0:
            raise ConfigError(f"retry_after_s must be > 0, got {self.retry_after_s}")


@dataclass(frozen=True)
class LimitsConfig:
    """Bounds on client input, checked before any expensive work.

    Attributes:
        max_tiles_per_request: Most tiles one request may carry.
        max_image_bytes: Largest encoded tile accepted.
        max_image_pixels: Largest decoded image (w*h) accepted, checked from
            the header before decoding (decompression bombs).
        max_bulk_rna_length: Longest bulk RNA vector accepted.
        max_body_bytes: Largest HTTP request body accepted.
        max_tiles_per_slide: Slide models: most tiles (``N``) one slide may carry.
    """

    max_tiles_per_request: int = 1024
    max_image_bytes: int = 8 * 1024 * 1024
    max_image_pixels: int = 4096 * 4096
    max_bulk_rna_length: int = 100_000
    max_body_bytes: int = 256 * 1024 * 1024
    max_tiles_per_slide: int = 200_000

    def __post_init__(self) -> None:
        for name in (
            "max_tiles_per_request",
            "max_image_bytes",
            "max_image_pixels",
            "max_bulk_rna_length",
            "max_body_bytes",
            "max_tiles_per_slide",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


FORWARD_RUNNERS = ("auto", "torch", "gil_free")
"""``--forward_runner`` choices (see :class:`ModelConfig`)."""
JPEG_DECODES = ("auto", "cpu", "device")
"""``--jpeg_decode`` choices (see :class:`ModelConfig`)."""


@dataclass(frozen=True)
class ModelConfig:
    """Which package to serve, where, and how.

    Attributes:
        model_dir: Directory holding checkpoints (``/opt/ml/model``).
        checkpoint: File name in ``model_dir``; ``None`` picks the only ``*.pt2``.
        spec: Built-in spec name or spec file path overriding the embedded one.
        model_name: Name in URLs; ``None`` uses the spec's name.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        preprocess_workers: Stage-1 decode threads.
        fault_injection: Test-only forward fault hook (see :mod:`predictor.device.faults`);
            ``None`` (the default) disables it.
        forward_runner: ``auto`` (the default: ``gil_free`` on the CPU, falling
            back to ``torch`` with one log line for a package it cannot serve;
            ``torch`` on a GPU), ``torch`` (torch's AOTInductor loader) or
            ``gil_free`` (:mod:`predictor.package.aoti_runner`: the package's C
            ABI called with the GIL released, CPU only).
        instances_per_device: Device workers sharing the one queue (Triton's
            instance groups), per device: CPU or each GPU (own normaliser and
            CUDA stream per instance). ``None`` (the default, ``auto``): what
            measured best for the device (:func:`predictor.device.cpus.resolve_instances`).
        model_class: ``MODULE:CLASS`` of a ``BaseServerModel`` subclass to
            serve; ``None`` serves the spec family's class.
        jpeg_decode: Where the jpeg transport's slide tiles are decoded: ``cpu``
            (libjpeg-turbo in the stage-1 pool: the pixel path's features bit
            for bit), ``device`` (nvJPEG on a CUDA device, composed and
            resized there: :mod:`predictor.device.jpeg`; the CPU where it
            cannot run) or ``auto`` (the default: ``device`` on a GPU).
        allow_tf32: Lets fp32 packages run their cuBLAS/cuDNN matmuls and
            convolutions in TF32 on CUDA (Ampere and later: several times faster,
            ~1e-3 relative error); bf16/fp16 packages and the CPU are unaffected.
    """

    model_dir: Path = Path("/opt/ml/model")
    checkpoint: str | None = None
    spec: str | None = None
    model_name: str | None = None
    device: str = "auto"
    preprocess_workers: int = 2
    fault_injection: str | None = None
    forward_runner: str = "auto"
    instances_per_device: int | None = None
    model_class: str | None = None
    allow_tf32: bool = False
    jpeg_decode: str = "auto"

    def __post_init__(self) -> None:
        if self.instances_per_device is not None and self.instances_per_device < 1:
            raise ConfigError(f"instances_per_device must be >= 1, got {self.instances_per_device}")
        if self.forward_runner not in FORWARD_RUNNERS:
            raise ConfigError(
                f"forward_runner must be auto, torch or gil_free, got {self.forward_runner!r}"
            )
        if self.preprocess_workers < 1:
            raise ConfigError(f"preprocess_workers must be >= 1, got {self.preprocess_workers}")
        if self.jpeg_decode not in JPEG_DECODES:
            raise ConfigError(f"jpeg_decode must be auto, cpu or device, got {self.jpeg_decode!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
