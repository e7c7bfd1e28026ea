"""A model folder's own settings file: the server's defaults, overridden per model.

``<model_dir>/<name>/histoserve.json`` is a JSON object of server flags (their
names without ``--``) that differ for this model: its batching (``max_batch_size``,
``max_latency_ms``, ``max_queue_size``, the classes of service, its ``weight``
on a device it shares with the other models), its package
and how it runs (``spec``, ``checkpoint``, ``model_class``, ``instances_per_device``,
``forward_runner``, ``jpeg_decode``, ``load_probe``, ``load_timeout_s``,
``allow_tf32``, ``preprocess_workers``). Each value is read as the flag's own
text would be, then checked by its config; an unknown key or a bad value stops
this model's load with a message naming the file. The model's name is its
folder's and its device the server's: neither is a setting. ``--model_settings
DIR`` adds ``DIR/<name>.json`` of the same form over it: settings given where
the model folder is read-only (the chart renders them into a ConfigMap).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from predictor.config import BatchingConfig, ModelConfig
from predictor.errors import ConfigError
from predictor.flags import declared
from predictor.repository.layout import SETTINGS_FILE

MODEL_KEYS = (
    "spec", "checkpoint", "model_class", "instances_per_device", "forward_runner",
    "jpeg_decode", "load_probe", "load_timeout_s", "allow_tf32", "preprocess_workers",
)  # fmt: skip
"""The :class:`ModelConfig` flags a model folder may set (not its name, folder or device)."""
MAX_SETTINGS_BYTES = 64 * 1024


def model_settings(
    name: str,
    folder: Path,
    model: ModelConfig,
    batching: BatchingConfig,
    settings_dir: Path | None = None,
) -> tuple[ModelConfig, BatchingConfig]:
    """The configs of the model in ``folder``: the server's, its settings file over them,
    then ``settings_dir/<name>.json`` (``--model_settings``: the chart's values) over both.

    Raises:
        ConfigError: A settings file is unreadable, not a JSON object, has
            an unknown key or a value its flag refuses (names the file and key).
    """
    configs = replace(model, model_dir=folder, model_name=name), batching
    paths = [folder / SETTINGS_FILE]
    if settings_dir is not None:
        paths.append(settings_dir / f"{name}.json")
    for path in paths:
        if path.is_file():
            configs = _applied(path, *configs)
    return configs


def _applied(
    path: Path, model: ModelConfig, batching: BatchingConfig
) -> tuple[ModelConfig, BatchingConfig]:
    raw = _read(path)
    flags = {f.name: d for cls in (ModelConfig, BatchingConfig) for f, d in declared(cls)}
    allowed = {*MODEL_KEYS, *(f.name for f, _ in declared(BatchingConfig))}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting {', '.join(map(repr, unknown))} "
            f"(a model folder may set: {', '.join(sorted(allowed))})"
        )
    values = {key: _convert(path, key, value, flags[key].type) for key, value in raw.items()}
    try:
        return (
            replace(model, **{k: v for k, v in values.items() if k in MODEL_KEYS}),
            replace(batching, **{k: v for k, v in values.items() if k not in MODEL_KEYS}),
        )
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            text = file.read(MAX_SETTINGS_BYTES + 1)
        if len(text) > MAX_SETTINGS_BYTES:
            raise ConfigError(f"{path}: over {MAX_SETTINGS_BYTES} bytes")
        raw = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a JSON object of settings, got {type(raw).__name__}")
    return raw


def _convert(path: Path, key: str, value: Any, convert: Any) -> Any:
    """``value`` as its flag's text would convert (lists: comma-separated; null: unset)."""
    if value is None:
        return None
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list) and value:
        text = ",".join(str(v) for v in value)
    elif isinstance(value, (int, float, str)):
        text = str(value)
    else:
        raise ConfigError(f"{path}: setting {key!r} has a value of no flag's form: {value!r}")
    if convert is None:
        return text
    try:
        return convert(text)
    except Exception as exc:  # each flag's type raises its own kind
        raise ConfigError(f"{path}: setting {key!r}: {exc}") from exc
