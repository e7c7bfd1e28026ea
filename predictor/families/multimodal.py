"""Multimodal tile + bulk RNA predictor (``m-optimus``).

Per tile: an image and, optionally, a raw bulk RNA vector of ``G`` counts.
Stage 1 validates the vector (length ``G``, finite, non-negative) and applies
the spec's ``log1p``; a bad vector is a 400 for its request, never a batch
failure. A tile without bulk RNA gets an all-NaN row, the package's sentinel
for "absent" (it substitutes a learned default), so one batch can mix tiles
with and without bulk RNA. The package returns ``(prediction, embedding)``
from one forward pass; predictions go out ``expm1``-transformed and rounded.

Gene lists (input and output Ensembl IDs) load from CSV assets beside the
checkpoint; their lengths must match the package's shapes at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from predictor import genes
from predictor import package as pkg
from predictor.errors import ForwardError, InvalidInput, SpecMismatch
from predictor.families import register_family
from predictor.model import BaseServerModel
from predictor.samples import ModelRequest, ModelResponse, PreparedSample

# expm1 overflows float32 just above 88.7; clip the log-space prediction below that.
_MAX_LOG_PREDICTION = 88.0

_OUTPUTS_BY_MODE = {
    "prediction": ("prediction",),
    "embedding": ("embedding",),
    "prediction_with_embedding": ("prediction", "embedding"),
}


@register_family("multimodal")
class MultimodalServerModel(BaseServerModel):
    """Serves a tile + bulk RNA model: outputs ``prediction`` and/or ``embedding``."""

    genes_in: list[str]
    genes_out: list[str]

    def check_package(self, package: pkg.LoadedPackage) -> None:
        root = Path(package.path).parent
        spec = self.model_spec
        self.genes_in = list(genes.read_gene_ids(root / (spec.genes_in_file or "genes_in.csv")))
        self.genes_out = list(genes.read_gene_ids(root / (spec.genes_out_file or "genes_out.csv")))
        shapes = pkg.probe_outputs(package, spec, self.extra_input_shapes(package))
        pkg.check_consistency(spec, shapes)
        predicted = shapes[0][-1]
        if predicted != len(self.genes_out):
            raise SpecMismatch(
                f"spec {spec.name!r}: {spec.genes_out_file} lists {len(self.genes_out)} genes "
                f"but the package predicts {predicted}"
            )

    def extra_input_shapes(self, package: pkg.LoadedPackage) -> Mapping[str, int]:
        declared = pkg.declared_input_dim(package, "bulk_rna")
        if declared is not None and declared != len(self.genes_in):
            raise SpecMismatch(
                f"spec {self.model_spec.name!r}: {self.model_spec.genes_in_file} lists "
                f"{len(self.genes_in)} genes but the package takes bulk_rna of {declared}"
            )
        return {"bulk_rna": len(self.genes_in)}

    # -- stage 1 ----------------------------------------------------------------------
    def prepare_sample(self, request: ModelRequest) -> PreparedSample:
        sample = super().prepare_sample(request)
        n_genes = len(self.genes_in)
        if request.bulk_rna is None:
            rna = np.full(n_genes, np.nan, dtype=np.float32)
        else:
            try:
                rna = self.preprocess_bulk_rna(self._validated_counts(request.bulk_rna, n_genes))
            except InvalidInput as exc:
                raise exc.at(input_name="bulk_rna") from exc
        sample.extra_tensors["bulk_rna"] = torch.from_numpy(rna)
        return sample

    @staticmethod
    def _validated_counts(raw: np.ndarray, n_genes: int) -> np.ndarray:
        counts = np.asarray(raw)
        if counts.ndim != 1 or counts.shape[0] != n_genes:
            raise InvalidInput(f"expected {n_genes} gene counts, got shape {tuple(counts.shape)}")
        if not np.issubdtype(counts.dtype, np.number):
            raise InvalidInput(f"gene counts must be numbers, got {counts.dtype}")
        counts = counts.astype(np.float32, copy=False)
        finite = np.isfinite(counts)
        if not finite.all():
            first = int(np.argmin(finite))
            raise InvalidInput(f"gene count {first} is not finite ({counts[first]})")
        if (counts < 0).any():
            first = int(np.argmax(counts < 0))
            raise InvalidInput(f"gene count {first} is negative ({counts[first]})")
        return counts

    # -- stage 2 ----------------------------------------------------------------------
    def batch_inputs(self, samples: Sequence[PreparedSample]) -> tuple[torch.Tensor, ...]:
        (tiles,) = super().batch_inputs(samples)
        rna = torch.stack([s.extra_tensors["bulk_rna"] for s in samples])
        return tiles, rna.to(self.device, dtype=tiles.dtype, non_blocking=True)

    def build_responses(
        self, outputs: Sequence[np.ndarray], requests: Sequence[ModelRequest], mode: str
    ) -> list[ModelResponse]:
        log_prediction, embedding = outputs[0], outputs[1]
        names = _OUTPUTS_BY_MODE[mode]
        per_output: dict[str, np.ndarray] = {}
        if "prediction" in names:
            per_output["prediction"] = self._transform_predictions(log_prediction)
        if "embedding" in names:
            per_output["embedding"] = embedding
        return [
            ModelResponse({name: arr[i] for name, arr in per_output.items()}, r.metadata)
            for i, r in enumerate(requests)
        ]

    def _transform_predictions(self, log_prediction: np.ndarray) -> np.ndarray:
        if not np.isfinite(log_prediction).all():
            raise ForwardError("the package returned non-finite predictions for this batch")
        spec = self.model_spec
        values = log_prediction
        if spec.prediction_transform == "expm1":
            values = np.expm1(np.minimum(values, _MAX_LOG_PREDICTION))
        return np.round(values, spec.prediction_decimals).astype(np.float32, copy=False)

    # -- description --------------------------------------------------------------------
    def output_names(self, mode: str) -> tuple[str, ...]:
        return _OUTPUTS_BY_MODE[mode]

    def output_datatypes(self) -> Mapping[str, str]:
        return {"prediction": "FP32", "embedding": "FP32"}

    def output_shapes(self) -> Mapping[str, list[int]]:
        return {
            "prediction": [-1, len(self.genes_out)],
            "embedding": [-1, self.model_spec.embedding_dim],
        }

    def input_descriptions(self) -> list[dict[str, Any]]:
        return [
            *super().input_descriptions(),
            {"name": "bulk_rna", "datatype": "FP32", "shape": [-1, len(self.genes_in)]},
        ]

    def get_metadata(self) -> dict[str, Any]:
        return super().get_metadata() | {"genes_in": self.genes_in, "genes_out": self.genes_out}
