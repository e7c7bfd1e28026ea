"""Start-up assembly: from a :class:`ModelConfig` to a loaded, checked model.

Resolves the checkpoint, the spec (embedded in the package, or overridden by
``--spec``), the device and the family class, then loads the package. Every
problem raises a :class:`~predictor.errors.StartupError` with one clear line.
"""

from __future__ import annotations

from predictor import package as pkg
from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
from predictor.errors import SpecError
from predictor.families import model_class_for
from predictor.faults import parse_fault_spec
from predictor.metrics import create_metrics
from predictor.model import BaseServerModel, ServingOptions
from predictor.spec import METADATA_KEY, ModelSpec, resolve_spec, spec_from_json


def resolve_model_spec(metadata: dict[str, str], override: str | None) -> ModelSpec:
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
    """Builds and loads the model the config describes (fail-fast)."""
    checkpoint = pkg.find_checkpoint(config.model_dir, config.checkpoint)
    pkg.verify_sha256(checkpoint)
    spec = resolve_model_spec(pkg.read_metadata(checkpoint), config.spec)
    device = pkg.resolve_device(config.device)
    name = config.model_name or spec.name
    options = ServingOptions(
        batching=batching,
        limits=limits,
        preprocess_workers=config.preprocess_workers,
        name=name,
    )
    fault_hook = parse_fault_spec(config.fault_injection) if config.fault_injection else None
    cls = model_class_for(spec)
    model = cls(
        spec,
        checkpoint.name,
        device=str(device),
        model_root=checkpoint.parent,
        options=options,
        metrics=create_metrics(name),
        fault_hook=fault_hook,
    )
    model.load()
    return model
