"""Start-up probe: run the loaded package on the spec's inputs and check its outputs.

A spec and a package can disagree (a 768-wide encoder served under a 1536
spec, a gene list of the wrong length, a multimodal package that cannot take
a tile without bulk RNA). Probing with batches of 1 and 2 at start-up turns
each of those into one clear :class:`~predictor.errors.SpecMismatch` line
before the server reports ready, instead of wrong answers later. What the
shapes must be is each family's to say (``check_outputs`` in
:mod:`predictor.families`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from predictor.errors import SpecMismatch
from predictor.packages.metadata import INPUTS_KEY, read_field
from predictor.runtime.loader import LoadedPackage
from predictor.spec import ModelSpec


def declared_input_dim(loaded: LoadedPackage, name: str) -> int | None:
    """The per-tile size of input ``name`` as the package's ``histoserve.inputs`` records it.

    Returns:
        The size of the input's second axis (e.g. the bulk RNA gene count
        ``G``), or ``None`` when the package does not record that input.
    """
    for desc in read_field(loaded.metadata, INPUTS_KEY):
        if desc.get("name") == name and len(desc.get("shape", ())) >= 2:
            return int(desc["shape"][1])
    return None


@dataclass(frozen=True)
class InputDesc:
    """One package input: name, shape (``-1`` for the batch axis) and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def expected_inputs(
    loaded: LoadedPackage, spec: ModelSpec, extra_dims: Mapping[str, int] | None = None
) -> tuple[InputDesc, ...]:
    """The inputs a package takes, from the spec, cross-checked with its metadata.

    The tile input follows the spec; the bulk RNA gene count ``G`` of
    multimodal packages comes from ``extra_dims['bulk_rna']`` (e.g. the gene
    list) or from the ``histoserve.inputs`` metadata; when both exist they
    must agree.

    Raises:
        SpecMismatch: Spec and metadata disagree on an input, or ``G`` is unknown.
    """
    size, dtype = spec.tile_size, loaded.input_dtype
    wanted = [InputDesc("tiles", (-1, 3, size, size), dtype)]
    recorded = {d["name"]: d for d in read_field(loaded.metadata, INPUTS_KEY)}
    if spec.takes_bulk_rna:
        genes = _gene_count(recorded.get("bulk_rna"), dict(extra_dims or {}), spec)
        wanted.append(InputDesc("bulk_rna", (-1, genes), torch.float32))
    if recorded:
        _compare_inputs(wanted, list(recorded.values()), spec)
    return tuple(wanted)


def _gene_count(recorded: Mapping[str, Any] | None, extra: dict[str, int], spec: ModelSpec) -> int:
    from_meta = int(recorded["shape"][1]) if recorded else None
    given = extra.get("bulk_rna")
    if given is not None and from_meta is not None and given != from_meta:
        raise SpecMismatch(
            f"spec {spec.name!r}: the gene list has {given} input genes but the package takes {from_meta}"
        )
    count = given if given is not None else from_meta
    if count is None:
        raise SpecMismatch(
            f"spec {spec.name!r}: cannot tell the package's bulk RNA gene count "
            f"(no {INPUTS_KEY} metadata and no {spec.genes_in_file or 'genes_in'} list)"
        )
    return count


def _compare_inputs(
    wanted: Sequence[InputDesc], recorded: Sequence[Mapping[str, Any]], spec: ModelSpec
) -> None:
    if len(recorded) != len(wanted):
        names = [r.get("name") for r in recorded]
        raise SpecMismatch(
            f"spec {spec.name!r} ({spec.family}) feeds {len(wanted)} input(s) but the package takes {names}"
        )
    for want, rec in zip(wanted, recorded, strict=True):
        shape = tuple(int(d) for d in rec.get("shape", ()))
        if shape[1:] != want.shape[1:]:
            raise SpecMismatch(
                f"spec {spec.name!r} says input {want.name!r} is {list(want.shape)} "
                f"but the package takes {list(shape)}"
            )


def probe_outputs(
    loaded: LoadedPackage, spec: ModelSpec, extra_dims: Mapping[str, int] | None = None
) -> tuple[torch.Size, ...]:
    """Runs batches of 1 and 2 to learn the package's per-tile output shapes.

    Tiles are zeros; multimodal packages also get one real bulk RNA row and
    one all-``NaN`` row ("no bulk RNA"), whose outputs must be finite.

    Returns:
        Each output's shape without the batch axis, primary output first.

    Raises:
        SpecMismatch: The package fails on the spec's inputs, returns fewer
            rows than tiles, shapes that change with the batch, or non-finite
            values for a tile without bulk RNA.
    """
    inputs = expected_inputs(loaded, spec, extra_dims)
    shapes = [_probe_once(loaded, spec, inputs, batch) for batch in (1, 2)]
    if shapes[0] != shapes[1]:
        raise SpecMismatch(
            f"package {loaded.path.name}: per-tile output shapes change with the batch "
            f"({format_shapes(shapes[0])} at 1, {format_shapes(shapes[1])} at 2)"
        )
    return shapes[1]


def _probe_once(
    loaded: LoadedPackage, spec: ModelSpec, inputs: Sequence[InputDesc], batch: int
) -> tuple[torch.Size, ...]:
    args = [torch.zeros((batch, *d.shape[1:]), dtype=d.dtype, device=loaded.device) for d in inputs]
    if len(args) > 1:
        args[1][-1] = float("nan")
    try:
        with torch.inference_mode():
            outputs = loaded(*args)
    except Exception as exc:
        shapes = ", ".join(f"{d.name} {[batch, *d.shape[1:]]}" for d in inputs)
        raise SpecMismatch(
            f"package {loaded.path.name} fails on spec {spec.name!r} inputs ({shapes}): {exc}"
        ) from exc
    for i, out in enumerate(outputs):
        if out.dim() == 0 or out.shape[0] < batch:
            raise SpecMismatch(
                f"package {loaded.path.name}: output {i} has shape {list(out.shape)} for a batch of {batch}"
            )
        if out.is_floating_point() and not bool(torch.isfinite(out[:batch]).all()):
            raise SpecMismatch(
                f"package {loaded.path.name}: output {i} is not finite for spec {spec.name!r} probe "
                f"inputs (zeros tiles{', a NaN bulk RNA row' if len(args) > 1 else ''})"
            )
    return tuple(out.shape[1:] for out in outputs)


def format_shapes(shapes: Sequence[Sequence[int]]) -> str:
    """``[1536], [32]``: shapes for one-line messages."""
    return ", ".join(str(list(s)) for s in shapes)
