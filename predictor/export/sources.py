"""Model sources for the exporter beyond ``--demo``: ``--module`` and ``--timm``.

``--module pkg.mod:factory`` imports any ``nn.Module`` factory, with its
weights from ``--weights FILE`` when given (:func:`load_weights`). ``--timm ARCH
--weights FILE`` builds real weights through timm, imported lazily inside
:func:`build_timm` only: timm imports torchvision, which does not import beside
the CPU torch used here and is never needed for serving.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from predictor.errors import SpecError
from predictor.families import demo_example_inputs
from predictor.packages.digest import sha256_file
from predictor.spec import ModelSpec


def load_factory(target: str) -> Callable[..., nn.Module]:
    """Resolves ``pkg.mod:factory`` to the callable.

    Raises:
        SpecError: Malformed target, module not importable, or no such attribute.
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SpecError(f"--module {target!r} must look like pkg.mod:factory")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"--module {target!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpecError(f"--module {target!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SpecError(f"--module {target!r} is not callable")
    return obj


def build_from_factory(factory: Callable[..., nn.Module], spec: ModelSpec) -> nn.Module:
    """Calls ``factory(spec)`` when it takes a ``spec`` parameter, else ``factory()``."""
    params = inspect.signature(factory).parameters
    module = factory(spec) if "spec" in params else factory()
    if not isinstance(module, nn.Module):
        raise SpecError(f"factory {factory!r} returned {type(module).__name__}, not an nn.Module")
    return module


def weights_digest(weights: Path) -> str:
    """The weights file's SHA-256 (what provenance and the build key record).

    Hashed once per process for one file as it is (path, size, modification
    time): ``--package_set`` needs the digest for the key before the export
    loads the weights, and a ViT-g file is gigabytes.

    Raises:
        SpecError: The file does not exist.
    """
    weights = Path(weights).resolve()
    if not weights.is_file():
        raise SpecError(f"weights file {weights} does not exist")
    stat = weights.stat()
    return _digest(weights, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _digest(path: Path, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


def load_weights(module: nn.Module, weights: Path) -> str:
    """Loads ``weights`` (``.safetensors`` or a torch state dict) into ``module``, strictly.

    Returns:
        The weights file's SHA-256.

    Raises:
        SpecError: Missing or unreadable file, or keys/shapes that do not fit the module.
    """
    digest = weights_digest(weights)
    try:
        state = _load_state_dict(Path(weights))
    except Exception as exc:  # safetensors' and torch.load's own errors, wrapped
        raise SpecError(f"weights file {weights} cannot be read: {exc}") from exc
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise SpecError(f"weights {weights} do not fit the --module model: {exc}") from exc
    return digest


def module_example_inputs(
    module: nn.Module, spec: ModelSpec, batch: int = 2
) -> tuple[torch.Tensor, ...]:
    """Example inputs for a user module: its ``example_inputs(batch)`` if it has one,
    else the spec's geometry (bulk RNA length from a ``genes_in`` attribute)."""
    custom = getattr(module, "example_inputs", None)
    if callable(custom):
        return tuple(custom(batch))
    genes_in = getattr(module, "genes_in", None)
    return demo_example_inputs(spec, batch, genes_in=None if genes_in is None else int(genes_in))


def build_timm(spec: ModelSpec, arch: str, weights: Path) -> tuple[nn.Module, str]:
    """A timm model with real weights (the optional ``export`` extra; embedding specs).

    timm is imported here only: it imports torchvision, which the serving
    runtime never needs. ``spec.extra['timm_kwargs']`` (``k=v,...``) goes to
    ``timm.create_model``; ``spec.extra['pooling'] == 'cls+mean'`` wraps the
    model to return CLS concatenated with the mean patch token (H0-mini).

    Returns:
        The module and the weights file's SHA-256 (recorded in provenance).

    Raises:
        SpecError: Not an embedding spec, timm not importable, weights missing
            or not matching the architecture.
    """
    if spec.family != "embedding":
        raise SpecError(f"--timm exports embedding specs only; {spec.name!r} is {spec.family}")
    try:
        import timm
    except Exception as exc:  # ImportError, or torchvision failing inside timm
        raise SpecError(
            f"--timm needs timm (pip install 'histoserve[export]'); importing it failed: {exc}"
        ) from exc
    weights = Path(weights)
    if not weights.is_file():
        raise SpecError(f"weights file {weights} does not exist")
    kwargs = _timm_kwargs(str(spec.extra.get("timm_kwargs", "")), timm)
    model = timm.create_model(arch, pretrained=False, num_classes=0, **kwargs)
    try:
        model.load_state_dict(_load_state_dict(weights))
    except RuntimeError as exc:
        raise SpecError(f"weights {weights} do not fit timm {arch!r}: {exc}") from exc
    if spec.extra.get("pooling") == "cls+mean":
        model = _ClsMeanPool(model, int(getattr(model, "num_prefix_tokens", spec.prefix_tokens)))
    return model, weights_digest(weights)


def _timm_kwargs(text: str, timm: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, raw = item.partition("=")
        try:
            kwargs[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            layer = getattr(timm.layers, raw, None) or getattr(nn, raw, None)
            if layer is None:
                raise SpecError(f"timm kwarg {key}={raw!r}: no such timm/torch layer") from None
            kwargs[key] = layer
    return kwargs


def _load_state_dict(weights: Path) -> dict[str, torch.Tensor]:
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(weights))
    return torch.load(weights, map_location="cpu", weights_only=True)


class _ClsMeanPool(nn.Module):
    """CLS token concatenated with the mean of the patch tokens (H0-mini's output)."""

    def __init__(self, model: nn.Module, prefix_tokens: int):
        super().__init__()
        self.model = model
        self.prefix_tokens = prefix_tokens

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        tokens = self.model.forward_features(tiles)
        return torch.cat([tokens[:, 0], tokens[:, self.prefix_tokens :].mean(dim=1)], dim=-1)
