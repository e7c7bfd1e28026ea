"""The two runners a package is served by, built here: torch's loader called flat, or the GIL-free one.

:class:`TorchRunner` calls torch's ``AOTIModelPackageLoader`` the way
``AOTICompiledModel.__call__`` does, minus the per-call work a server never
needs: that wrapper fetches the call spec and parses both treespecs
(``pytree.treespec_loads``) on every call, flattens the arguments and
unflattens the outputs, all with the GIL held. Served packages take flat
positional tensors and return flat tensors, so the specs are read once, at
load, and checked to be flat there; each call is one ``boxed_run``. On CUDA
the forward still only launches kernels, with the GIL held for the launch
(torch's binding does not release it); the GIL-free C-ABI runner
(:mod:`predictor.runtime.aoti_runner`) serves CPU packages.

Model copies: on CUDA every instance is served by two pipelined lanes
(``predictor.device.pipeline``) whose forwards run back to back on one
stream. AOTInductor's container lends each run a model copy and, with
none free, blocks the launching thread until the oldest run's event (its
``reclaim_finished_models``), which would drain the stream between
batches; so a CUDA package is loaded with :data:`CUDA_COPIES_PER_INSTANCE`
copies per instance. The copies share the container's weights (one
constants map); each adds only its own small run state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from predictor.errors import CheckpointError

logger = logging.getLogger("histoserve")

CUDA_COPIES_PER_INSTANCE = 2
"""Model copies per CUDA instance: one per pipelined lane (``predictor.device.pipeline.LANES``)."""


class TorchRunner:
    """torch's package loader called with flat tensors: specs read once, one ``boxed_run`` a call.

    Args:
        loader: A ``torch._C._aoti.AOTIModelPackageLoader``.

    Raises:
        ValueError: The package's call spec is not flat tensors in and out
            (:func:`as_torch_runner` then keeps torch's own wrapper).
    """

    forward_runner = "torch"
    """The ``--forward_runner`` name (:attr:`LoadedPackage.forward_runner` reads it)."""
    flat = True
    """Outputs come back as one flat tuple already (no pytree walk needed)."""

    def __init__(self, loader: Any) -> None:
        in_spec, out_spec = (pytree.treespec_loads(s) for s in loader.get_call_spec())
        if not _flat_inputs(in_spec) or not _flat(out_spec):
            raise ValueError(f"not a flat call spec: {in_spec} -> {out_spec}")
        self.loader = loader
        self.num_inputs = _children(in_spec)[0].num_leaves

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One forward on the current device and stream; the flat outputs in order."""
        if len(inputs) != self.num_inputs:
            raise ValueError(f"the package takes {self.num_inputs} inputs, got {len(inputs)}")
        return tuple(self.loader.boxed_run(list(inputs)))

    def get_metadata(self) -> Mapping[str, str]:
        """The package's AOTInductor metadata."""
        return self.loader.get_metadata()


def _children(spec: Any) -> list[Any]:
    """A treespec's children (``children()`` since torch 2.10, ``children_specs`` before)."""
    children = getattr(spec, "children", None)
    return list(children()) if callable(children) else list(spec.children_specs)


def _flat(spec: Any) -> bool:
    """A tuple or list whose children are all tensors (leaves), or one leaf."""
    if spec.is_leaf():
        return True
    return spec.type in (tuple, list) and all(c.is_leaf() for c in _children(spec))


def _flat_inputs(spec: Any) -> bool:
    """``((t0, t1, ...), {})``: positional tensors only, no keyword arguments."""
    if spec.type is not tuple or spec.num_children != 2:
        return False
    args, kwargs = _children(spec)
    return _flat(args) and not args.is_leaf() and kwargs.type is dict and kwargs.num_children == 0


def as_torch_runner(loader: Any) -> Any:
    """:class:`TorchRunner` over ``loader``; torch's own wrapper where the spec is not flat
    (or this torch's loader or treespecs differ from what :class:`TorchRunner` reads)."""
    try:
        return TorchRunner(loader)
    except (ValueError, AttributeError, TypeError, RuntimeError) as exc:
        from torch.export.pt2_archive._package import AOTICompiledModel

        logger.info("torch's call wrapper kept for this package (%s)", exc)
        return AOTICompiledModel(loader)


def load_kind(
    path: Path,
    device: torch.device,
    kind: str,
    instances: int,
    *,
    metadata: Mapping[str, str] | None = None,
    timer: Callable[[str], AbstractContextManager[None]] | None = None,
) -> Any:
    """One runner of ``kind`` (``gil_free`` or ``torch``), no fallback.

    ``torch`` builds torch's loader without ``aoti_load_package``'s ISA probe
    (see :func:`predictor.runtime.loader._load_runner`) with ``instances``
    model copies (:data:`CUDA_COPIES_PER_INSTANCE` times that on CUDA); where
    that private API differs, the public call, one copy only.

    Raises:
        CheckpointError: ``instances`` above 1 where only the public call works.
    """
    if kind == "gil_free":
        from predictor.runtime.aoti_runner import GilFreeRunner

        # The device worker builds each batch tensor itself and no other
        # thread sees it: no input is ever resized during a forward.
        runner = GilFreeRunner(
            path,
            device,
            num_models=instances,
            metadata=metadata,
            extraction_timer=timer,
            private_inputs=True,
        )
        logger.info(
            "%s on %s: loaded by the GIL-free C-ABI runner (torch %s), %d model copies",
            path.name,
            device,
            torch.__version__,
            instances,
        )
        return runner
    index = device.index if device.index is not None else (0 if device.type == "cuda" else -1)
    copies = instances * (CUDA_COPIES_PER_INSTANCE if device.type == "cuda" else 1)
    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, copies, index)
    except (AttributeError, TypeError):
        logger.info(
            "%s on %s: torch %s lacks the AOTI loader API used; loading by aoti_load_package",
            path.name,
            device,
            torch.__version__,
        )
    else:
        logger.info(
            "%s on %s: loaded by torch's AOTI loader (torch %s), %d model copies",
            path.name,
            device,
            torch.__version__,
            copies,
        )
        return as_torch_runner(loader)
    if instances > 1:
        raise CheckpointError(
            f"--instances_per_device {instances} needs torch's AOTI package loader with several "
            f"model copies, which torch {torch.__version__} does not offer; use 1 instance"
        )
    return torch._inductor.aoti_load_package(str(path), device_index=index)
