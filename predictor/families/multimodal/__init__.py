"""Multimodal tile + bulk RNA predictor (``m-optimus``).

Per tile: an image and, optionally, a raw bulk RNA vector of ``G`` counts.
Stage 1 validates the vector (length ``G``, finite, non-negative), applies
the spec's ``log1p`` and refuses a value beyond the finite range of the
dtype the package computes in (FP16: 65504); a bad vector is a 400 for its
request, never a batch failure. A tile without bulk RNA gets an all-NaN row, the package's sentinel
for "absent" (it substitutes a learned default), so one batch can mix tiles
with and without bulk RNA. The package returns ``(prediction, embedding)``
from one forward pass; predictions go out ``expm1``-transformed and rounded.

Gene lists (input and output Ensembl IDs) load from CSV assets beside the
checkpoint (:mod:`~predictor.families.multimodal.genes`); their lengths must
match the package's shapes at start-up.

The family declares its modes (:data:`histoserve.wire.MODE_OUTPUTS`, every
tile mode), its spec section (the transforms, their rounding and the gene
list files) and owns the counts' transform: the spec's, unless the served
model class overrides the seed's ``preprocess_bulk_rna`` (a seed hook it
calls back). Its demo model is :class:`DemoMultimodal`: the embedding
family's demo ViT for the tile, plus a bulk RNA branch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from histoserve.wire import MODE_OUTPUTS
from predictor.codecs.common import first_non_finite
from predictor.codecs.samples import ModelRequest, ModelResponse, PreparedSample
from predictor.device.slot import DeviceSlot
from predictor.errors import InvalidInput, SpecError, SpecMismatch
from predictor.families.embedding import DemoViT, vit_for
from predictor.families.multimodal import genes
from predictor.model.family import OutputSpec
from predictor.model.finite import first_beyond, input_limit
from predictor.model.tiles import TileFamily, check_embedding_shape
from predictor.runtime.loader import LoadedPackage
from predictor.runtime.probe import declared_input_dim
from predictor.spec import ModelSpec

# expm1 overflows float32 just above 88.7; clip the log-space prediction below that.
_MAX_LOG_PREDICTION = 88.0

DEMO_GENES_IN = 64
"""Input genes of the demo model (and of example inputs when no gene list sizes them)."""
DEMO_GENES_OUT = 32
"""Output genes of the demo model."""

BULK_RNA_TRANSFORMS = (None, "log1p")
"""What a spec's ``bulk_rna_transform`` may say (None: the counts as they are)."""
PREDICTION_TRANSFORMS = (None, "expm1")
"""What a spec's ``prediction_transform`` may say."""


class MultimodalFamily(TileFamily):
    """A tile + bulk RNA model: outputs ``prediction`` and/or ``embedding``."""

    MODE_OUTPUTS: ClassVar[Mapping[str, tuple[str, ...]]] = MODE_OUTPUTS
    SPEC_FIELDS: ClassVar[tuple[str, ...]] = (
        "bulk_rna_transform",
        "prediction_transform",
        "prediction_decimals",
        "genes_in_file",
        "genes_out_file",
    )
    SEED_HOOKS: ClassVar[tuple[str, ...]] = ("preprocess_bulk_rna",)
    PACKAGE_INPUTS: ClassVar[tuple[str, ...]] = ("tiles", "bulk_rna")
    PACKAGE_OUTPUTS: ClassVar[tuple[str, ...]] = ("prediction", "embedding")

    genes_in: list[str] = []  # noqa: RUF012 (replaced, never mutated)
    """Input gene ids, read beside the package by :meth:`load_assets` (none before)."""
    genes_out: list[str] = []  # noqa: RUF012
    """Output gene ids, read beside the package by :meth:`load_assets` (none before)."""

    # -- declaration, export and start-up ----------------------------------------------
    @classmethod
    def check_spec(cls, spec: ModelSpec) -> None:
        """The tile modes, and transforms this family knows."""
        super().check_spec(spec)
        if spec.bulk_rna_transform not in BULK_RNA_TRANSFORMS:
            raise SpecError(
                f"spec {spec.name!r}: unknown bulk_rna_transform {spec.bulk_rna_transform!r}; "
                f"known: {list(BULK_RNA_TRANSFORMS)}"
            )
        if spec.prediction_transform not in PREDICTION_TRANSFORMS:
            raise SpecError(
                f"spec {spec.name!r}: unknown prediction_transform "
                f"{spec.prediction_transform!r}; known: {list(PREDICTION_TRANSFORMS)}"
            )

    @classmethod
    def check_outputs(
        cls, spec: ModelSpec, shapes: Sequence[tuple[int, ...]], prediction_dim: int | None
    ) -> None:
        prediction, embedding = shapes
        if len(prediction) != 1:
            raise SpecMismatch(
                f"spec {spec.name!r} expects a per-tile prediction vector but the package returns shape {list(prediction)}"
            )
        if prediction_dim is not None and prediction[0] != prediction_dim:
            raise SpecMismatch(
                f"spec {spec.name!r}: the output gene list has {prediction_dim} genes but the package predicts {prediction[0]}"
            )
        check_embedding_shape(spec, embedding)

    @classmethod
    def build_demo(cls, spec: ModelSpec, preset: str, opts: dict[str, Any]) -> nn.Module:
        genes_in = int(opts.pop("genes_in", DEMO_GENES_IN))
        genes_out = int(opts.pop("genes_out", DEMO_GENES_OUT))
        embedding_dim = opts.get("embedding_dim", spec.embedding_dim)
        vit = vit_for(spec, preset, opts)
        return DemoMultimodal(
            vit, genes_in=genes_in, genes_out=genes_out, embedding_dim=embedding_dim
        )

    @classmethod
    def example_inputs(
        cls, spec: ModelSpec, batch: int, *, genes_in: int | None, seed: int
    ) -> tuple[torch.Tensor, ...]:
        """Tiles and ``bulk_rna [B, genes_in]``, whose last row is all ``NaN`` when ``batch > 1``.

        So the "no bulk RNA" path is part of every export and probe.
        ``genes_in`` None: :data:`DEMO_GENES_IN`.
        """
        gen = torch.Generator().manual_seed(seed)
        size = spec.tile_size
        tiles = torch.randn(batch, 3, size, size, generator=gen)
        genes_in = DEMO_GENES_IN if genes_in is None else genes_in
        bulk = torch.rand(batch, genes_in, generator=gen) * 5.0
        if batch > 1:
            bulk[-1] = float("nan")
        return tiles, bulk

    def load_assets(self, root: Path) -> None:
        spec = self.spec
        self.genes_in = list(genes.read_gene_ids(root / (spec.genes_in_file or "genes_in.csv")))
        self.genes_out = list(genes.read_gene_ids(root / (spec.genes_out_file or "genes_out.csv")))

    def check_package(self, package: LoadedPackage) -> list[tuple[int, ...]]:
        self.load_assets(Path(package.path).parent)
        spec = self.spec
        shapes = super().check_package(package)
        predicted = shapes[0][-1]
        if predicted != len(self.genes_out):
            raise SpecMismatch(
                f"spec {spec.name!r}: {spec.genes_out_file} lists {len(self.genes_out)} genes "
                f"but the package predicts {predicted}"
            )
        return shapes

    def extra_input_shapes(self, package: LoadedPackage) -> Mapping[str, int]:
        declared = declared_input_dim(package, "bulk_rna")
        if declared is not None and declared != len(self.genes_in):
            raise SpecMismatch(
                f"spec {self.spec.name!r}: {self.spec.genes_in_file} lists "
                f"{len(self.genes_in)} genes but the package takes bulk_rna of {declared}"
            )
        return {"bulk_rna": len(self.genes_in)}

    # -- stage 1 ----------------------------------------------------------------------
    def prepare_sample(self, request: ModelRequest) -> PreparedSample:
        """The tile, and its bulk RNA counts (``request.family_input``) transformed and checked.

        The counts go through the served model's ``preprocess_bulk_rna`` (the
        seed's hook: :meth:`preprocess_bulk_rna` unless a model class
        overrides it); a tile without counts gets the all-NaN row.
        """
        sample = super().prepare_sample(request)
        n_genes = len(self.genes_in)
        if request.family_input is None:
            rna = np.full(n_genes, np.nan, dtype=np.float32)
        else:
            try:
                counts = self._validated_counts(request.family_input, n_genes)
                hook = self.seed_hooks.get("preprocess_bulk_rna")
                rna = self.preprocess_bulk_rna(counts) if hook is None else _held(hook, counts)
                self._check_range(rna)
            except InvalidInput as exc:
                raise exc.at(input_name="bulk_rna") from exc
        sample.extra_tensors["bulk_rna"] = rna
        return sample

    def preprocess_bulk_rna(self, raw: Sequence[float] | np.ndarray) -> np.ndarray:
        """The spec's ``bulk_rna_transform`` of raw counts, ``float32`` (unchanged when none).

        The default of the model's seed hook of the same name.
        """
        values = np.asarray(raw, dtype=np.float32)
        if self.spec.bulk_rna_transform == "log1p":
            return np.log1p(values)
        return values

    def _check_range(self, rna: np.ndarray) -> None:
        """InvalidInput for a value (after the spec's transform) the package's dtype cannot hold."""
        dtype = self.served.package_dtype
        limit = input_limit(dtype)
        beyond = first_beyond(rna[None], limit)
        if beyond is not None:
            name = str(dtype).removeprefix("torch.")
            raise InvalidInput(
                f"value {beyond[1]:g} (after the spec's transform) is beyond the finite range of "
                f"the package's {name} (+-{limit:g}): the model would overflow"
            )

    @staticmethod
    def _validated_counts(raw: np.ndarray, n_genes: int) -> np.ndarray:
        counts = np.asarray(raw)
        if counts.ndim != 1 or counts.shape[0] != n_genes:
            raise InvalidInput(f"expected {n_genes} gene counts, got shape {tuple(counts.shape)}")
        if not np.issubdtype(counts.dtype, np.number):
            raise InvalidInput(f"gene counts must be numbers, got {counts.dtype}")
        counts = counts.astype(np.float32, copy=False)
        first = first_non_finite(counts)
        if first is not None:
            raise InvalidInput(f"gene count {first} is not finite ({counts[first]})")
        if (counts < 0).any():
            first = int(np.argmax(counts < 0))
            raise InvalidInput(f"gene count {first} is negative ({counts[first]})")
        return counts

    # -- stage 2 ----------------------------------------------------------------------
    def batch_inputs(
        self, samples: Sequence[PreparedSample], slot: DeviceSlot
    ) -> tuple[torch.Tensor, ...]:
        (tiles,) = super().batch_inputs(samples, slot)
        # float32 whatever the tile dtype: the exporter keeps bulk_rna float32 in bf16/fp16 packages.
        rna = torch.from_numpy(np.stack([s.extra_tensors["bulk_rna"] for s in samples]))
        return tiles, rna.to(tiles.device, dtype=torch.float32, non_blocking=True)

    def build_responses(self, outputs: Sequence[np.ndarray], mode: str) -> list[ModelResponse]:
        log_prediction, embedding = outputs[0], outputs[1]
        names = self.MODE_OUTPUTS[mode]
        per_output: dict[str, np.ndarray] = {}
        if "prediction" in names:
            per_output["prediction"] = self._transform_predictions(log_prediction)
        if "embedding" in names:
            per_output["embedding"] = embedding
        n = len(outputs[0])
        return [ModelResponse({name: arr[i] for name, arr in per_output.items()}) for i in range(n)]

    def _transform_predictions(self, log_prediction: np.ndarray) -> np.ndarray:
        """``expm1`` and rounding, finite for finite input (a non-finite row failed on the device).

        Rounded in float64: float32 rounding scales by ``10**decimals`` first,
        which overflows to infinity above ~3e35 (``expm1(88)`` is 1.6e38).
        """
        spec = self.spec
        values = log_prediction
        if spec.prediction_transform == "expm1":
            values = np.expm1(np.minimum(values, _MAX_LOG_PREDICTION))
        rounded = np.round(values.astype(np.float64), spec.prediction_decimals)
        return rounded.astype(np.float32)

    # -- outputs ------------------------------------------------------------------------
    def outputs(self, mode: str | None = None) -> tuple[OutputSpec, ...]:
        """``prediction`` ``FP32 [-1, genes_out]`` and ``embedding`` ``FP32 [-1, D]``, by mode."""
        every = {
            "prediction": OutputSpec("prediction", "FP32", (-1, len(self.genes_out))),
            "embedding": OutputSpec("embedding", "FP32", (-1, self.spec.embedding_dim)),
        }
        names = self.MODE_OUTPUTS[mode] if mode is not None else tuple(every)
        return tuple(every[name] for name in names)

    def input_types(self) -> list[dict[str, Any]]:
        return [
            *super().input_types(),
            {"name": "bulk_rna", "datatype": "FP32", "shape": [-1, len(self.genes_in)]},
        ]

    def metadata(self) -> Mapping[str, Any]:
        return {"genes_in": self.genes_in, "genes_out": self.genes_out}


FAMILY = MultimodalFamily
"""The ``multimodal`` family's hooks (the registry: :func:`predictor.families.family_for`)."""


def _held(hook: Callable[[np.ndarray], np.ndarray], counts: np.ndarray) -> np.ndarray:
    """A model class's ``preprocess_bulk_rna`` of ``counts``, held to the package's input:
    ``float32 [G]`` (a ``ValueError`` there is the request's 400, as in ``prepare_sample``)."""
    rna = np.asarray(hook(counts), dtype=np.float32)
    if rna.shape != counts.shape:
        raise InvalidInput(
            f"preprocess_bulk_rna returned shape {list(rna.shape)} for {list(counts.shape)} counts"
        )
    return rna


# -- the demo model ---------------------------------------------------------------------


class DemoMultimodal(nn.Module):
    """Tile + bulk RNA model: ``(tiles, bulk_rna)`` -> ``(prediction, embedding)``.

    ``bulk_rna`` is ``[B, G]`` float32, already ``log1p``-transformed; ``NaN``
    entries (a whole ``NaN`` row means "no bulk RNA") take the learned default.
    ``prediction`` is ``[B, K]`` in log space (non-negative, so the runtime's
    ``expm1`` gives non-negative expression); ``embedding`` is ``[B, D]``.
    """

    def __init__(self, vit: DemoViT, *, genes_in: int, genes_out: int, embedding_dim: int):
        super().__init__()
        self.genes_in = genes_in
        self.genes_out = genes_out
        self.vit = vit
        self.default_rna = nn.Parameter(torch.rand(genes_in) * 2.0)
        self.rna = nn.Sequential(nn.Linear(genes_in, 128), nn.GELU(), nn.Linear(128, 128))
        self.predict = nn.Linear(embedding_dim + 128, genes_out)

    def forward(
        self, tiles: torch.Tensor, bulk_rna: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        embedding = self.vit(tiles)
        dtype = self.default_rna.dtype
        rna = bulk_rna.to(dtype)
        rna = torch.where(torch.isnan(rna), self.default_rna.expand_as(rna), rna)
        fused = torch.cat([embedding, self.rna(rna)], dim=-1)
        prediction = F.softplus(self.predict(fused))
        return prediction, embedding
